#include "recipe/sections/sections.h"

namespace engine::recipe {

void declare_data(Schema& schema) {
  const std::vector<std::string> token_sources{"synthetic_markov", "text", "tokens"};
  const std::vector<std::string> file_sources{"text", "tokens"};
  auto data = schema.section("data", &Recipe::data, "Where training and validation batches come from.");
  data.key("source", &DataSection::source)
      .choices({{"synthetic_markov", DataSource::synthetic_markov},
                {"text", DataSource::text},
                {"tokens", DataSource::tokens},
                {"classification", DataSource::classification}})
      .required()
      .help(
          "synthetic_markov: a seeded Markov chain whose entropy rate is the loss floor; text: a UTF-8 "
          "file as byte tokens; tokens: pre-tokenised uint16 files; classification: synthetic labelled "
          "vectors for mlp.");
  data.key("sequence_length", &DataSection::sequence_length)
      .auto_default("model.context_length")
      .min(1)
      .only_when("source", token_sources)
      .unit("tokens")
      .limit(1 << 24)
      .help("Tokens per training sample.");
  data.key("path", &DataSection::path)
      .required()
      .must_exist()
      .only_when("source", file_sources)
      .help("Data file, relative to the recipe file that names it.");
  data.key("format", &DataSection::format)
      .choices({{"auto", TokenFormat::auto_detect},
                {"llmc", TokenFormat::llmc},
                {"raw_uint16", TokenFormat::raw_uint16},
                {"raw_uint32", TokenFormat::raw_uint32}})
      .def(TokenFormat::auto_detect)
      .only_when("source", {"tokens"})
      .help(
          "Token file layout: llmc (llm.c's .bin with its 256-int header: version 1 holds uint16 "
          "tokens, version 2 uint32, for vocabularies past 65536), raw_uint16 (as nanoGPT writes), "
          "raw_uint32, or auto (the llm.c header where there is one, else raw_uint16).");
  data.key("loss_mask", &DataSection::loss_mask)
      .must_exist()
      .derived_default("none: every token is trained")
      .only_when("source", {"tokens"})
      .help(
          "Which tokens are trained, for instruction data: a file of one byte per token of data.path, 0 "
          "where a token is not predicted (a prompt), 1 where it is (a response); as "
          "scripts/prepare-tokens --mask-out writes it. The loss is the mean over the trained tokens of "
          "each step (all its micro-batches and ranks), as PyTorch's ignore_index gives it.");
  data.key("document_end", &DataSection::document_end)
      .min(0)
      .limit(int64_t(1) << 31)
      .derived_default("none (auto): a window is one sequence")
      .only_when("source", file_sources)
      .help(
          "Packing: the token that ends a document (the tokenizer's end-of-text, as scripts/prepare-tokens "
          "writes it after each one). A window then holds several documents that do not see each other: "
          "attention stays within a document, positions restart at 0 after each end token, and the end "
          "token's target (the next document's first token) is not trained. CPU only for now.");
  data.key("val_fraction", &DataSection::val_fraction)
      .def(0.05)
      .min(0)
      .below(1)
      .help("Fraction of the data held out for validation.");
  data.key("order", &DataSection::order)
      .def(2)
      .min(1)
      .max(4)
      .only_when("source", {"synthetic_markov"})
      .help("Order of the Markov chain: how many previous tokens determine the next one's distribution.");
  data.key("branching", &DataSection::branching)
      .def(4)
      .min(1)
      .max(64)
      .only_when("source", {"synthetic_markov"})
      .help("Successors per context, with Zipf probabilities 1/(j+1); the entropy rate is their entropy.");
  data.key("vocab_size", &DataSection::vocab_size)
      .auto_default("model.vocab_size")
      .min(2)
      .only_when("source", {"synthetic_markov"})
      .unit("tokens")
      .limit(1 << 24)
      .help("Number of distinct tokens the Markov source emits; at most model.vocab_size.");
  data.key("num_samples", &DataSection::num_samples)
      .def(4096)
      .min(1)
      .only_when("source", {"classification"})
      .unit("samples")
      .limit(int64_t(1) << 32)
      .help("Number of labelled vectors generated.");
  data.key("noise", &DataSection::noise)
      .def(0.1)
      .min(0)
      .only_when("source", {"classification"})
      .help("Standard deviation of the noise added to each class centre.");
  data.key("shuffle", &DataSection::shuffle)
      .def(true)
      .help("Shuffle samples each epoch (deterministically, from run.seed).");
  data.key("prefetch", &DataSection::prefetch)
      .def(2)
      .min(0)
      .max(64)
      .unit("batches")
      .help("Batches prepared ahead by the background loader; 0 loads on the training thread.");
}

}  // namespace engine::recipe
