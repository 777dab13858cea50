// Text generation from a trained model, to show at the end of a run that it learned something.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "models/model.h"

namespace primus {

inline constexpr double kSampleTemperature = 0.8;

// Samples `length` tokens after `prompt` (temperature kSampleTemperature; the context is the last
// `context_length` tokens) and returns the decoded continuation. An empty prompt starts from the EOD token.
std::string generate_sample(Model& model, const Tokenizer& tokenizer, const std::string& prompt, int64_t length,
                            int64_t context_length, uint64_t seed);
// The same from any source of next-token logits (a pipeline's: train/pipeline_step.h, where every stage calls it).
using NextTokenLogitsFn = std::function<std::vector<float>(const std::vector<int32_t>& context)>;
std::string generate_sample(const NextTokenLogitsFn& next_token_logits, const Tokenizer& tokenizer,
                            const std::string& prompt, int64_t length, int64_t context_length, uint64_t seed);

}  // namespace primus
