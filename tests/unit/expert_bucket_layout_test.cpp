// The bucket layout with expert ranges (parallel/grad_reducer.h): the buckets tile the flat buffer, none crosses
// between an expert range and the rest, each is reduced over its own group, only tails smaller than their group are
// uneven, and the ranks' shards cover every element exactly once within each group. Without expert ranges the layout
// is the data-parallel one. Pure functions: no ranks run.
#include <gtest/gtest.h>

#include <vector>

#include "parallel/grad_reducer.h"

namespace primus {
namespace {

// Whether [begin, end) lies inside one of `ranges`.
bool inside(const std::vector<FlatRange>& ranges, FlatRange r) {
  for (const FlatRange& x : ranges) {
    if (r.begin >= x.begin && r.end <= x.end) return true;
  }
  return false;
}

TEST(ExpertBucketLayout, BucketsTileTheBufferAndKeepToTheirGroup) {
  const int64_t numel = 1000;
  const std::vector<FlatRange> experts{{100, 237}, {400, 401}, {600, 999}};
  for (int dp : {2, 4, 8}) {
    for (int expert_dp = 1; expert_dp <= dp; expert_dp *= 2) {
      for (int64_t bucket : {1, 7, 64, 5000}) {
        const BucketLayout layout(numel, bucket, dp, experts, expert_dp);
        std::vector<int> seen(numel, 0), owners_dense(numel, 0), owners_expert(numel, 0);
        int64_t top = numel;
        for (size_t k = 0; k < layout.buckets().size(); ++k) {
          const FlatRange b = layout.buckets()[k];
          EXPECT_EQ(b.end, top) << "bucket " << k << " does not follow the one above";  // top of the buffer first
          top = b.begin;
          EXPECT_EQ(layout.expert(k), inside(experts, b)) << "bucket [" << b.begin << ", " << b.end << ")";
          const int g = layout.group_size(k);
          EXPECT_EQ(g, layout.expert(k) ? expert_dp : dp);
          EXPECT_TRUE(b.size() % g == 0 || b.size() < g) << "uneven bucket of " << b.size() << " for a group of " << g;
          for (int64_t i = b.begin; i < b.end; ++i) ++seen[i];
        }
        EXPECT_EQ(top, 0);
        for (int64_t i = 0; i < numel; ++i) EXPECT_EQ(seen[i], 1) << "element " << i;
        // Each data-parallel rank's shards: the dense elements once over dp, the expert elements once per expert group.
        for (int r = 0; r < dp; ++r) {
          for (const FlatRange& s : layout.owned(r, r % expert_dp)) {
            for (int64_t i = s.begin; i < s.end; ++i) {
              if (inside(experts, {i, i + 1})) {
                ++owners_expert[i];
              } else {
                ++owners_dense[i];
              }
            }
          }
        }
        for (int64_t i = 0; i < numel; ++i) {
          if (inside(experts, {i, i + 1})) {
            EXPECT_EQ(owners_expert[i], dp / expert_dp) << "expert element " << i;  // once in each expert group
          } else {
            EXPECT_EQ(owners_dense[i], 1) << "element " << i;
          }
        }
      }
    }
  }
}

TEST(ExpertBucketLayout, OnlyTailsSmallerThanTheGroupAreUneven) {
  // dp 4: [0, 10) dense (8 even + 2 tail), [10, 15) experts over 2 (4 even + 1 tail), [15, 16) dense (1 < 4).
  const BucketLayout layout(16, 100, 4, {{10, 15}}, 2);
  const std::vector<FlatRange> want{{15, 16}, {14, 15}, {10, 14}, {8, 10}, {0, 8}};
  ASSERT_EQ(layout.buckets().size(), want.size());
  for (size_t k = 0; k < want.size(); ++k) {
    EXPECT_EQ(layout.buckets()[k].begin, want[k].begin) << k;
    EXPECT_EQ(layout.buckets()[k].end, want[k].end) << k;
  }
  EXPECT_TRUE(layout.expert(1) && layout.expert(2) && !layout.expert(0) && !layout.expert(3));
  EXPECT_EQ(layout.shard(1, 0).size(), 1);  // the expert tail: one element for rank 0 of the expert group
  EXPECT_TRUE(layout.shard(1, 1).empty());
}

}  // namespace
}  // namespace primus
