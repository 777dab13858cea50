// Hugging Face byte-level BPE tokenizers: tokenizer.json (GPT-2, Llama 3, Qwen, DeepSeek styles) and GPT-2's
// original vocab.json + merges.txt pair (FORMATS.md section 5).
//
// tokenizer.json support, field by field:
//   model          type "BPE"; vocab {spelled token: id}; merges as ["a b", ...] or [["a", "b"], ...];
//                  ignore_merges; byte_fallback, continuing_subword_prefix, end_of_word_suffix, dropout unset
//   pre_tokenizer  ByteLevel{add_prefix_space, use_regex}, or a Sequence of Split{pattern {Regex|String},
//                  behavior "Isolated", invert false} steps and one ByteLevel; Digits{individual_digits} too
//   normalizer     null, NFC, or a Sequence of those (NFC through utf8proc before added-token matching)
//   added_tokens   matched in the raw text before pre-tokenization: special ones only by encode_with_specials,
//                  the others by encode as well; lstrip, rstrip, single_word honoured
//   post_processor only read for the beginning-of-document token of a TemplateProcessing "single" template
// The end-of-document token is tokenizer_config.json's eos_token when that file sits beside tokenizer.json, else
// the first added token among <|end_of_text|>, <|endoftext|>, </s>, <|im_end|>, <eos>, <｜end▁of▁sentence｜>.
// Anything else (Unigram/WordPiece models, SentencePiece-style BPE with byte_fallback) is a UsageError naming the
// field; SentencePiece models load from tokenizer.model with SentencePieceTokenizer.
#pragma once

#include <memory>
#include <string>

#include "data/bpe_tokenizer.h"

namespace primus {

// path: tokenizer.json, or a directory holding it. Throws UsageError naming the file and JSON field.
std::unique_ptr<BpeTokenizer> load_hf_tokenizer(const std::string& path);

// path: a directory holding vocab.json and merges.txt, or the vocab.json file with merges.txt beside it.
// GPT-2's regex, merges in file order, <|endoftext|> as end of document. Errors name the file and line.
std::unique_ptr<BpeTokenizer> load_gpt2_bpe_tokenizer(const std::string& path);

}  // namespace primus
