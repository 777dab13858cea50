// GPTDataset against Megatron's rules (FORMATS.md §2) and against numpy itself: numpy's RandomState draws
// and shuffles, and a reference of the three indices computed by a Python snippet written from the format
// description (skipped without /usr/bin/python3 + numpy).
#include "data/gpt_dataset.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>

#include "core/error.h"
#include "core/file_io.h"
#include "core/rng.h"
#include "support/test_support.h"

namespace primus {
namespace {

namespace fs = std::filesystem;

// Runs a Python snippet with numpy; returns its stdout, or nullopt (skip) when numpy is unavailable.
std::optional<std::string> run_python(const std::string& script, const std::string& dir) {
  if (!fs::exists("/usr/bin/python3")) return std::nullopt;
  write_file_atomic(dir + "/script.py", script);
  std::FILE* pipe = ::popen(("/usr/bin/python3 " + dir + "/script.py 2>&1").c_str(), "r");
  if (pipe == nullptr) return std::nullopt;
  std::string out;
  char buffer[4096];
  size_t got;
  while ((got = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, got);
  int status = ::pclose(pipe);
  if (out.find("No module named 'numpy'") != std::string::npos) return std::nullopt;
  EXPECT_EQ(status, 0) << out;
  return out;
}

TEST(NumpyRandomState, RawOutputsEqualNumpyMt19937) {
  std::string dir = testing::temp_dir("np-raw");
  auto out = run_python(
      "import numpy as np\n"
      "for seed in (0, 1234, 4294967295):\n"
      "    print(' '.join(str(int(v)) for v in np.random.RandomState(seed)._bit_generator.random_raw(5)))\n",
      dir);
  if (!out) GTEST_SKIP() << "numpy unavailable";
  std::string mine;
  for (uint32_t seed : {0u, 1234u, 4294967295u}) {
    NumpyRandomState rng(seed);
    for (int i = 0; i < 5; ++i) mine += std::to_string(rng.next_u32()) + (i < 4 ? " " : "\n");
  }
  EXPECT_EQ(*out, mine);
}

TEST(NumpyRandomState, ShuffleEqualsNumpyShuffle) {
  std::string dir = testing::temp_dir("np-shuffle");
  // Sizes around powers of two exercise the rejection loop; 100000 draws many values.
  const std::vector<int64_t> sizes = {1, 2, 3, 17, 64, 65, 1000, 100000};
  auto out = run_python(
      "import numpy as np\n"
      "rs = np.random.RandomState(1234)\n"
      "for n in (1, 2, 3, 17, 64, 65, 1000, 100000):\n"
      "    a = np.arange(n, dtype=np.int64)\n"
      "    rs.shuffle(a)\n"
      "    print(' '.join(map(str, a.tolist())))\n",
      dir);
  if (!out) GTEST_SKIP() << "numpy unavailable";
  NumpyRandomState rng(1234);
  std::string mine;
  for (int64_t n : sizes) {
    std::vector<int64_t> a(static_cast<size_t>(n));
    std::iota(a.begin(), a.end(), 0);
    rng.shuffle(std::span<int64_t>(a));
    mine += fmt::format("{}\n", fmt::join(a, " "));
  }
  EXPECT_EQ(*out, mine);
}

TEST(MegatronSplit, RoundsHalfToEvenAndMatchesTheFormatsExample) {
  EXPECT_EQ(megatron_split_range(123457, "969,30,1", kSplitTrain), (DocumentRange{0, 119630}));
  EXPECT_EQ(megatron_split_range(123457, "969,30,1", kSplitValid), (DocumentRange{119630, 123334}));
  EXPECT_EQ(megatron_split_range(123457, "969,30,1", kSplitTest), (DocumentRange{123334, 123457}));
  // 5 × 0.5 = 2.5 rounds to 2 (half to even), 7 × 0.5 = 3.5 to 4.
  EXPECT_EQ(megatron_split_range(5, "1,1", kSplitTrain), (DocumentRange{0, 2}));
  EXPECT_EQ(megatron_split_range(7, "1,1", kSplitTrain), (DocumentRange{0, 4}));
  EXPECT_EQ(megatron_split_range(7, "1,1", kSplitTest), (DocumentRange{}));  // weight 0: no documents
  EXPECT_EQ(megatron_split_range(10, "98/2/0", kSplitValid), (DocumentRange{10, 10}));
  EXPECT_EQ(megatron_split_range(1000, "0.9, 0.1", kSplitValid), (DocumentRange{900, 1000}));
  EXPECT_THROW(parse_megatron_split("0,0,0"), UsageError);
  EXPECT_THROW(parse_megatron_split("1,2,3,4"), UsageError);
  EXPECT_THROW(parse_megatron_split("1.2.3,4"), UsageError);
  EXPECT_THROW(parse_megatron_split(std::string(400, '9') + ",1"), UsageError);  // beyond a double: was inf/inf
}

TEST(EpochPlan, FollowsMegatronsRules) {
  EpochPlan one = plan_epochs(1000, 10, 99);  // 10 × 99 + 1 = 991 <= 1000
  EXPECT_EQ(one.num_epochs, 1);
  EXPECT_FALSE(one.separate_final_epoch);
  EXPECT_EQ(one.num_built_samples, 10);  // (1000 − 1) // 99
  // T = 1000, L = 10: 99 samples an epoch; 250 samples need 2501 tokens, so 3 epochs.
  EpochPlan three = plan_epochs(1000, 250, 10);
  EXPECT_EQ(three.num_epochs, 3);
  EXPECT_EQ(three.samples_before_final_epoch, 199);  // (2 × 1000 − 1) // 10
  EXPECT_TRUE(three.separate_final_epoch);           // 51 from the final epoch < int(0.8 × 99) = 79
  EXPECT_EQ(three.num_built_samples, 299);
  EpochPlan together = plan_epochs(1000, 280, 10);  // 81 from the final epoch >= 79
  EXPECT_EQ(together.num_epochs, 3);
  EXPECT_FALSE(together.separate_final_epoch);
  EXPECT_THROW(plan_epochs(10, 1, 10), UsageError);  // 10 tokens cannot hold 11
  EXPECT_THROW(plan_epochs(100, 0, 10), UsageError);
}

TEST(SampleIndex, MatchesTheFormatsExample) {
  std::vector<int32_t> sizes = {5, 3, 4};
  std::vector<int64_t> documents = {0, 1, 2};
  std::vector<int64_t> rows = build_sample_index(sizes, documents, 4, 2);
  EXPECT_EQ(rows, (std::vector<int64_t>{0, 0, 0, 4, 2, 0}));
}

// A random indexed dataset written to `prefix`; returns its sequences.
std::vector<std::vector<int32_t>> write_dataset(const std::string& prefix, int64_t documents, Rng& rng,
                                                int64_t max_length = 50) {
  IndexedDatasetWriter writer(prefix, TokenDType::kU16);
  std::vector<std::vector<int32_t>> all;
  for (int64_t d = 0; d < documents; ++d) {
    // A few empty documents; they are skipped by sample building like any other.
    std::vector<int32_t> tokens(d % 37 == 5 ? 0 : 1 + rng.below(static_cast<uint64_t>(max_length)));
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng.below(60000)) + 1;
    writer.add_sequence(tokens);
    writer.end_document();
    all.push_back(tokens);
  }
  writer.finish();
  return all;
}

std::vector<int64_t> to_vector(const IndexArray& array) {
  std::vector<int64_t> out(static_cast<size_t>(array.size()));
  for (int64_t i = 0; i < array.size(); ++i) out[static_cast<size_t>(i)] = array[i];
  return out;
}

// The reference, written from FORMATS.md §2: epochs, document index (numpy shuffle; last epoch apart when
// few of its samples are used), sample index walk, shuffle index.
constexpr const char* kReferenceScript = R"(import json, sys
import numpy as np
cfg = json.load(open(sys.argv[1]))
sizes, seq, seed, want = cfg['sizes'], cfg['seq_length'], cfg['seed'], cfg['num_samples']
begin, end = cfg['begin'], cfg['end']
docs = np.arange(begin, end, dtype=np.int32)
T = int(sum(sizes[begin:end]))
E = 1
while E * T < want * seq + 1:
    E += 1
separate, sans = False, 0
if E > 1:
    per_epoch = (T - 1) // seq
    sans = ((E - 1) * T - 1) // seq
    separate = (want - sans) < int(0.80 * per_epoch)
rs = np.random.RandomState(seed)
def document_index(epochs):
    d = np.tile(docs, epochs).astype(np.int32)
    rs.shuffle(d)
    return d
di = np.concatenate([document_index(E - 1), document_index(1)]) if separate else document_index(E)
n = (E * T - 1) // seq
rows, pos, off = [[0, 0]], 0, 0
for s in range(1, n + 1):
    need = seq + 1
    while need != 0:
        avail = sizes[di[pos]] - off
        need -= avail
        if need <= 0:
            off += need + avail - 1
            need = 0
        elif pos == len(di) - 1:
            off = sizes[di[pos]] - 1
            break
        else:
            pos += 1
            off = 0
    rows.append([pos, off])
first = sans if separate else n
sh = np.arange(first, dtype=np.uint32)
rs.shuffle(sh)
if n > first:
    last = np.arange(first, n, dtype=np.uint32)
    rs.shuffle(last)
    sh = np.concatenate([sh, last])
print(json.dumps({'epochs': E, 'separate': bool(separate), 'document_index': [int(x) for x in di],
                  'sample_index': [v for r in rows for v in r], 'shuffle_index': [int(x) for x in sh]}))
)";

TEST(GPTDataset, IndicesEqualTheNumpyReferenceInEveryEpochRegime) {
  std::string dir = testing::temp_dir("gpt-numpy");
  Rng rng(2024);
  std::string prefix = dir + "/ds";
  auto sequences = write_dataset(prefix, 300, rng);
  auto data = std::make_shared<const IndexedDataset>(prefix);
  std::vector<int32_t> sizes;
  for (const auto& s : sequences) sizes.push_back(static_cast<int32_t>(s.size()));
  write_file_atomic(dir + "/script.py", kReferenceScript);

  const int64_t seq_length = 16;
  DocumentRange train = megatron_split_range(300, "90,8,2", kSplitTrain);
  int64_t tokens = 0;
  for (int64_t d = train.begin; d < train.end; ++d) tokens += sizes[static_cast<size_t>(d)];
  int64_t per_epoch = (tokens - 1) / seq_length;
  struct Case {
    SplitPart split;
    int64_t num_samples;
    uint32_t seed;
    bool separate;
  };
  std::vector<Case> cases = {{kSplitTrain, per_epoch / 2, 1234, false},
                             {kSplitTrain, 2 * per_epoch + per_epoch / 10, 7, true},
                             {kSplitTrain, 2 * per_epoch + per_epoch * 9 / 10, 1234, false},
                             {kSplitValid, 40, 99, false}};
  for (const Case& c : cases) {
    GPTDatasetConfig config;
    config.seq_length = seq_length;
    config.seed = c.seed;
    config.split = "90,8,2";
    config.use_cache = false;
    GPTDataset dataset(data, c.split, c.num_samples, config);
    if (c.split == kSplitTrain) {
      EXPECT_EQ(dataset.plan().separate_final_epoch, c.separate) << c.num_samples;
    }

    DocumentRange range = dataset.documents();
    nlohmann::json cfg = {{"sizes", sizes},       {"seq_length", seq_length},
                          {"seed", c.seed},       {"num_samples", c.num_samples},
                          {"begin", range.begin}, {"end", range.end}};
    write_file_atomic(dir + "/cfg.json", cfg.dump());
    std::FILE* pipe = ::popen(("/usr/bin/python3 " + dir + "/script.py " + dir + "/cfg.json 2>&1").c_str(), "r");
    ASSERT_NE(pipe, nullptr);
    std::string out;
    char buffer[65536];
    size_t got;
    while ((got = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, got);
    ::pclose(pipe);
    if (out.find("No module named") != std::string::npos) GTEST_SKIP() << "numpy unavailable";
    nlohmann::json reference = nlohmann::json::parse(out, nullptr, false);
    ASSERT_FALSE(reference.is_discarded()) << out.substr(0, 2000);
    EXPECT_EQ(reference["epochs"].get<int64_t>(), dataset.plan().num_epochs);
    EXPECT_EQ(reference["separate"].get<bool>(), dataset.plan().separate_final_epoch);
    EXPECT_EQ(reference["document_index"].get<std::vector<int64_t>>(), to_vector(dataset.document_index()));
    EXPECT_EQ(reference["sample_index"].get<std::vector<int64_t>>(), to_vector(dataset.sample_index()));
    EXPECT_EQ(reference["shuffle_index"].get<std::vector<int64_t>>(), to_vector(dataset.shuffle_index()));
  }
}

// Sample s is tokens [s·L, s·L + L + 1) of the documents concatenated in document-index order.
TEST(GPTDataset, SamplesAreWindowsOfTheShuffledDocumentStream) {
  std::string dir = testing::temp_dir("gpt-samples");
  Rng rng(77);
  auto sequences = write_dataset(dir + "/ds", 120, rng, 30);
  auto data = std::make_shared<const IndexedDataset>(dir + "/ds");
  GPTDatasetConfig config;
  config.seq_length = 24;
  config.split = "1";
  config.use_cache = false;
  GPTDataset dataset(data, kSplitTrain, 300, config);
  ASSERT_GT(dataset.plan().num_epochs, 1);
  std::vector<int32_t> stream;
  for (int64_t p = 0; p < dataset.document_index().size(); ++p) {
    const auto& doc = sequences[static_cast<size_t>(dataset.document_index()[p])];
    stream.insert(stream.end(), doc.begin(), doc.end());
  }
  std::vector<int32_t> out(25);
  for (int64_t k = 0; k < dataset.size() + 5; ++k) {  // past the end wraps around
    std::fill(out.begin(), out.end(), -1);
    dataset.read_sample(k, out);
    int64_t s = dataset.shuffle_index()[k % dataset.size()];
    std::vector<int32_t> want(stream.begin() + s * 24, stream.begin() + s * 24 + 25);
    ASSERT_EQ(out, want) << "sample " << k;
  }
  std::vector<int32_t> wrong(24);
  EXPECT_THROW(dataset.read_sample(0, wrong), RuntimeError);
}

TEST(GPTDataset, CachesAreWrittenOnceReusedAndRebuiltWhenDamaged) {
  std::string dir = testing::temp_dir("gpt-cache");
  Rng rng(5);
  write_dataset(dir + "/ds", 200, rng);
  auto data = std::make_shared<const IndexedDataset>(dir + "/ds");
  GPTDatasetConfig config;
  config.seq_length = 32;
  config.tokenizer = "ByteLevelTokenizer";
  auto read_all = [](const GPTDataset& d) {
    std::vector<int32_t> all, out(33);
    for (int64_t k = 0; k < d.size(); ++k) {
      d.read_sample(k, out);
      all.insert(all.end(), out.begin(), out.end());
    }
    return all;
  };
  GPTDataset first(data, kSplitTrain, 500, config);
  EXPECT_FALSE(first.loaded_from_cache());
  std::vector<std::string> files = first.cache_files();
  ASSERT_EQ(files.size(), 4u);
  for (const std::string& f : files) {
    EXPECT_TRUE(fs::exists(f)) << f;
    EXPECT_EQ(fs::path(f).parent_path(), fs::path(dir + "/ds/cache/GPTDataset_indices"));
    EXPECT_EQ(fs::path(f).filename().string().find(first.cache_hash() + "-GPTDataset-train-"), 0u) << f;
  }
  EXPECT_EQ(first.cache_hash(), md5_hex(first.description()));
  EXPECT_EQ(nlohmann::json::parse(first.description())["class"], "GPTDataset");
  std::vector<int32_t> expected = read_all(first);

  GPTDataset second(data, kSplitTrain, 500, config);
  EXPECT_TRUE(second.loaded_from_cache());
  EXPECT_EQ(second.shuffle_index().source(), files[3]);
  EXPECT_EQ(read_all(second), expected);

  // Another seed is another cache.
  GPTDatasetConfig other = config;
  other.seed = 1;
  GPTDataset reseeded(data, kSplitTrain, 500, other);
  EXPECT_NE(reseeded.cache_hash(), first.cache_hash());
  EXPECT_FALSE(reseeded.loaded_from_cache());

  // A truncated array is noticed, rebuilt, and gives the same samples.
  std::string shuffle = read_file(files[3]);
  write_file_atomic(files[3], shuffle.substr(0, shuffle.size() - 4));
  GPTDataset repaired(data, kSplitTrain, 500, config);
  EXPECT_FALSE(repaired.loaded_from_cache());
  EXPECT_EQ(read_all(repaired), expected);
  EXPECT_EQ(read_file(files[3]), shuffle);

  // Out-of-range values in a well-formed cache are caught at read time, never read out of bounds.
  std::vector<int64_t> bogus(static_cast<size_t>(first.size()), first.size() + 3);
  write_npy(files[3], bogus, {first.size()}, IndexDType::kU32);
  GPTDataset poisoned(data, kSplitTrain, 500, config);
  EXPECT_TRUE(poisoned.loaded_from_cache());
  std::vector<int32_t> out(33);
  EXPECT_THROW(poisoned.read_sample(0, out), RuntimeError);

  // A custom cache directory.
  GPTDatasetConfig elsewhere = config;
  elsewhere.cache_dir = dir + "/my-cache";
  GPTDataset moved(data, kSplitValid, 20, elsewhere);
  EXPECT_TRUE(fs::exists(dir + "/my-cache/" + moved.cache_hash() + "-GPTDataset-valid-shuffle_index.npy"));
}

TEST(GPTDataset, RejectsEmptySplitsAndTinyData) {
  std::string dir = testing::temp_dir("gpt-bad");
  Rng rng(9);
  write_dataset(dir + "/ds", 10, rng, 5);
  auto data = std::make_shared<const IndexedDataset>(dir + "/ds");
  GPTDatasetConfig config;
  config.seq_length = 8;
  config.use_cache = false;
  config.split = "100,0,0";
  EXPECT_THROW(GPTDataset(data, kSplitValid, 10, config), UsageError);
  config.seq_length = 1000;
  EXPECT_THROW(GPTDataset(data, kSplitTrain, 10, config), UsageError);
}

// Issue 12 hole 13: a token id the model has no embedding for used to fail inside embedding_forward, naming neither
// the dataset nor where the token is. Reading it is a UsageError naming the .bin file, byte offset and sequence.
TEST(GPTDataset, TokenIdsOutsideTheVocabularyNameTheFileAndOffset) {
  std::string dir = testing::temp_dir("gpt-vocab");
  {
    IndexedDatasetWriter writer(dir + "/ds", TokenDType::kU16);
    for (int d = 0; d < 20; ++d) writer.add_document(std::vector<int32_t>(10, d == 13 ? 999 : 7));
    writer.finish();
  }
  auto data = std::make_shared<const IndexedDataset>(dir + "/ds");
  GPTDatasetConfig config;
  config.seq_length = 9;
  config.split = "1";
  config.use_cache = false;
  config.vocab_size = 512;
  GPTDataset dataset(data, kSplitTrain, 20, config);
  std::vector<int32_t> out(10);
  std::string message;
  for (int64_t k = 0; k < dataset.size() && message.empty(); ++k) {
    try {
      dataset.read_sample(k, out);
    } catch (const UsageError& error) {
      message = error.what();
    }
  }
  EXPECT_NE(message.find(dir + "/ds.bin: token 999 at byte offset 260 (sequence 13, position 0)"), std::string::npos)
      << message;
  EXPECT_NE(message.find("vocab_size 512"), std::string::npos) << message;
  config.vocab_size = 1000;  // every id fits
  GPTDataset fitting(data, kSplitTrain, 20, config);
  for (int64_t k = 0; k < fitting.size(); ++k) fitting.read_sample(k, out);
}

TEST(SampleMasks, FollowMegatronsResetRules) {
  const int32_t eod = 9;
  std::vector<int32_t> tokens = {4, 5, eod, 6, 7, 8, eod, 1};
  SampleMasks plain = sample_masks(tokens, eod, false, false, false);
  EXPECT_EQ(plain.position_ids, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(plain.loss_mask, std::vector<float>(8, 1.0f));
  EXPECT_EQ(plain.segment_starts, std::vector<int32_t>{0});
  SampleMasks reset = sample_masks(tokens, eod, true, true, true);
  EXPECT_EQ(reset.position_ids, (std::vector<int32_t>{0, 1, 2, 0, 1, 2, 3, 0}));
  EXPECT_EQ(reset.loss_mask, (std::vector<float>{1, 1, 0, 1, 1, 1, 0, 1}));
  EXPECT_EQ(reset.segment_starts, (std::vector<int32_t>{0, 3, 7}));
  std::vector<int32_t> ends_with_eod = {1, eod};
  EXPECT_EQ(sample_masks(ends_with_eod, eod, true, true, false).segment_starts, std::vector<int32_t>{0});
}

}  // namespace
}  // namespace primus
