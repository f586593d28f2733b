// The end of a step whose tokens are chosen where the logits are: each logit
// row's token, from the argmax candidates of every rank's share (greedy) or
// from the sample op's ids, is published for the host and, for a decode
// batch, fed back as the row's next token with its position one higher, so
// that the next step can be queued before the host has seen this one's.
//
// A row with no token (the greedy candidates' best logit not finite, or a
// sampled id of -1: kernels/sampling.h) is published as -1, for the host to
// refuse, and fed back as token 0, which the next step can read safely.
//
// Publication: the k-th call (k counted on the backend, in *published_count)
// writes its ids to published[k % 2][row], memory the host reads once the
// step is done (Backend::alloc_host_visible); with two slots the host may
// queue step k + 1 before it reads step k.
#pragma once

#include <cstdint>

#include "kernels/op_common.h"

namespace lockstep {

struct NextTokensParams {
  // Greedy: [shares][values (rows · splits) | columns (rows · splits)],
  // 4-byte elements (float32 values, int32 columns of the share, -1 for no
  // candidate); share s holds vocabulary columns from s · share_cols.
  const void* candidates = nullptr;
  int64_t shares = 1;
  int64_t splits = 1;
  int64_t share_cols = 0;
  int64_t vocab = 0;  // shares that start at or past it are padding
  // Sampling (candidates null): the chosen ids, [rows].
  const int32_t* sampled = nullptr;
  int64_t rows = 0;
  // Feed back (null tokens: none): tokens[row] = the chosen id; positions[row]
  // + 1, capped at max_position, except for rows in padding_slot.
  int32_t* tokens = nullptr;
  int32_t* positions = nullptr;
  const int32_t* slots = nullptr;
  int32_t padding_slot = -1;
  int32_t max_position = 0;
  int32_t* published = nullptr;  // [2][published_stride]
  int64_t published_stride = 0;
  uint32_t* published_count = nullptr;
  void validate() const {
    LS_OP_REQUIRE((candidates != nullptr) != (sampled != nullptr), "next_tokens",
                  "needs exactly one of candidates and sampled ids");
    LS_OP_REQUIRE(published && published_count, "next_tokens", "null pointer");
    LS_OP_REQUIRE(rows >= 0 && rows <= published_stride, "next_tokens", "{} rows for {} published slots", rows,
                  published_stride);
    LS_OP_REQUIRE(!candidates || (shares > 0 && splits > 0 && share_cols > 0 && vocab > 0), "next_tokens",
                  "bad candidate sizes shares={} splits={} share_cols={} vocab={}", shares, splits, share_cols,
                  vocab);
    LS_OP_REQUIRE(!tokens || (positions && slots && max_position >= 0), "next_tokens", "feed back without positions");
  }
};

namespace cpu {
void next_tokens(const NextTokensParams& p);
}

}  // namespace lockstep
