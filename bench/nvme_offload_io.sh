#!/usr/bin/env bash
# The NVMe tier's I/O on this machine: sequential write then read of a 2 GiB swap file through
# engine::SwapFile (bench/swap_io_bench.cpp), next to fio's io_uring engine at the same
# block size and queue depth, with O_DIRECT, in the same directory. The goal is SwapFile at >= 80%
# of fio.
#
#   bench/nvme_offload_io.sh [DIR]
#     DIR   where the files go: the disk under test (default: a fresh directory under the build
#           directory, on the repository's disk; removed afterwards)
#   BUILD overrides the build directory (default build/), SIZE the file size (default 2G), REPEAT
#   the runs of each (default 3).
#
# Rows: 1 MiB blocks at queue depth 8, and 256 KiB at queue depth 32. SwapFile and fio take turns,
# REPEAT times each, and the table shows the median of each column: a shared or virtual disk's
# speed drifts by tens of percent from one pass to the next. The page cache is dropped before every
# pass when this user may (root). Prints one markdown table.
set -euo pipefail
cd "$(dirname "$0")/.."

case ${1:-} in -h | --help) sed -n '/^#   bench/,/^#   BUILD/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
build=${BUILD:-build}
size=${SIZE:-2G}
repeat=${REPEAT:-3}
[[ $repeat =~ ^[1-9][0-9]*$ ]] || { echo "nvme_offload_io.sh: REPEAT must be a positive integer, not '$repeat'" >&2; exit 2; }
bench=$build/bench/swap_io_bench
[[ -x $bench ]] || { echo "nvme_offload_io.sh: $bench not found; build the swap_io_bench target first" >&2; exit 2; }
command -v fio > /dev/null || { echo "nvme_offload_io.sh: fio not found (apt install fio; scripts/setup)" >&2; exit 2; }
if [[ -n ${1:-} ]]; then
  [[ -d $1 ]] || { echo "nvme_offload_io.sh: $1 is not a directory" >&2; exit 2; }
  work=$(mktemp -d "$1/nvme-offload-io.XXXXXX")
else
  work=$(mktemp -d "$build/nvme-offload-io.XXXXXX")
fi
trap 'rm -rf "$work"' EXIT
bytes=$(numfmt --from=iec "$size")

cache="warm (not root: page cache kept)"
drop_caches() { sync; if echo 3 > /proc/sys/vm/drop_caches 2> /dev/null; then cache="dropped"; fi; }
drop_caches  # here, not only inside $(fio_pass ...), so that $cache says what happened

# fio's bandwidth in MB/s (1e6 bytes) of one sequential pass.
fio_pass() { # rw bs iodepth
  drop_caches
  fio --name=swap --filename="$work/fio.bin" --size="$bytes" --rw="$1" --bs="$2" --iodepth="$3" \
    --ioengine=io_uring --direct=1 --output-format=json |
    python3 -c "import json, sys; j = json.load(sys.stdin)['jobs'][0]; print('%.1f' % (j['$1' == 'write' and 'write' or 'read']['bw_bytes'] / 1e6))"
}

echo "| block / queue depth | SwapFile write MB/s | fio write MB/s | write ratio | SwapFile read MB/s | fio read MB/s | read ratio |"
echo "|---|---:|---:|---:|---:|---:|---:|"
median() { tr ' ' '\n' | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

for row in "1048576 8" "262144 32"; do
  read -r bs qd <<< "$row"
  sw_write=() sw_read=() fio_write=() fio_read=()
  for ((r = 0; r < repeat; ++r)); do
    line=$("$bench" --dir "$work" --bytes "$bytes" --block-size "$bs" --queue-depth "$qd")
    [[ $line == *direct=1* ]] || echo "nvme_offload_io.sh: $work refuses O_DIRECT; SwapFile went through the page cache" >&2
    sw_write+=("$(sed -n 's/.*write_MBps=\([0-9.]*\).*/\1/p' <<< "$line")")
    sw_read+=("$(sed -n 's/.*read_MBps=\([0-9.]*\).*/\1/p' <<< "$line")")
    fio_write+=("$(fio_pass write "$bs" "$qd")")
    fio_read+=("$(fio_pass read "$bs" "$qd")")
    rm -f "$work/fio.bin"
  done
  awk -v bs="$bs" -v qd="$qd" -v sw="$(median <<< "${sw_write[*]}")" -v fw="$(median <<< "${fio_write[*]}")" \
    -v sr="$(median <<< "${sw_read[*]}")" -v fr="$(median <<< "${fio_read[*]}")" 'BEGIN {
    printf "| %d KiB / %d | %.0f | %.0f | %.0f%% | %.0f | %.0f | %.0f%% |\n", bs / 1024, qd, sw, fw, 100 * sw / fw, sr, fr, 100 * sr / fr }'
  echo "  ${bs}/${qd}: SwapFile write ${sw_write[*]}, read ${sw_read[*]}; fio write ${fio_write[*]}, read ${fio_read[*]}" >> "$work/runs"
done
echo
cat "$work/runs"
echo "$size file in $work ($(df --output=source,fstype "$work" | tail -1 | tr -s ' ')); page cache: $cache; O_DIRECT, no fsync (fio: end_fsync=0); median of $repeat runs (each run's MB/s above)."
