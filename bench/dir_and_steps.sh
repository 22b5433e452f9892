# Sourced by the benchmarks that take [--dir DIR] [--steps N]: parses them into $dir and $steps
# (set the defaults first) and answers -h with the caller's usage().
#
#   dir="" steps=5
#   parse_dir_and_steps offload_step.sh 3 "$@"   # name for messages, the fewest steps allowed
parse_dir_and_steps() {
  local name=$1 min_steps=$2
  shift 2
  while (($#)); do
    case $1 in
      --dir) dir=${2:?--dir needs a directory}; shift 2 ;;
      --steps) steps=${2:?--steps needs a number}; shift 2 ;;
      -h | --help) usage; exit 0 ;;
      *) echo "$name: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
    esac
  done
  [[ $steps =~ ^[0-9]+$ && $steps -ge $min_steps ]] ||
    { echo "$name: --steps must be an integer >= $min_steps, not '$steps'" >&2; exit 2; }
}
