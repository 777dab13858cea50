#include "train/sampling.h"

#include <algorithm>
#include <cmath>

#include "core/rng.h"

namespace primus {

std::string generate_sample(Model& model, const Tokenizer& tokenizer, const std::string& prompt, int64_t length,
                            int64_t context_length, uint64_t seed) {
  return generate_sample([&](const std::vector<int32_t>& context) { return model.next_token_logits(context); },
                         tokenizer, prompt, length, context_length, seed);
}

std::string generate_sample(const NextTokenLogitsFn& next_token_logits, const Tokenizer& tokenizer,
                            const std::string& prompt, int64_t length, int64_t context_length, uint64_t seed) {
  std::vector<int32_t> tokens = tokenizer.encode(prompt);
  if (tokens.empty()) tokens.push_back(tokenizer.eod_id());
  const size_t prompt_tokens = tokens.size();
  Rng rng = Rng::derive(seed, 0x5A3D1E);
  for (int64_t i = 0; i < length; ++i) {
    const size_t from = tokens.size() > static_cast<size_t>(context_length) ? tokens.size() - context_length : 0;
    std::vector<float> logits = next_token_logits({tokens.begin() + from, tokens.end()});
    // Only real tokens can be drawn: the padded tail of the vocabulary never appears in data.
    logits.resize(tokenizer.vocab_size());
    const float max_logit = *std::max_element(logits.begin(), logits.end());
    std::vector<double> weights(logits.size());
    double total = 0.0;
    for (size_t v = 0; v < logits.size(); ++v) total += weights[v] = std::exp((logits[v] - max_logit) / kSampleTemperature);
    double pick = rng.uniform() * total;
    size_t chosen = 0;
    while (chosen + 1 < weights.size() && pick >= weights[chosen]) pick -= weights[chosen++];
    tokens.push_back(static_cast<int32_t>(chosen));
  }
  return tokenizer.decode({tokens.data() + prompt_tokens, tokens.size() - prompt_tokens});
}

}  // namespace primus
