//! The tokenizer rebuilt from a GGUF file's metadata (vocabulary, merges, token types, special
//! ids): building it and using it on text with special tokens, digits, whitespace runs and
//! multi-byte characters must give results or errors, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use saguaro::model::gguf::Gguf;
use saguaro::model::tokenizer::{StreamDecoder, Tokenizer};

#[global_allocator]
static ALLOC: saguaro_fuzz::Bounded = saguaro_fuzz::Bounded;

const TEXTS: [&str; 4] = [
    "def f(x):\n    return x**2  # 12345\n\n   0",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "naïve café — “quotes” 日本語 🚀",
    "   \t\r\n",
];

fuzz_target!(|data: &[u8]| {
    let Ok(g) = Gguf::parse(data) else { return };
    let Ok(tok) = Tokenizer::from_gguf(&g) else { return };
    for text in TEXTS {
        let Ok(ids) = tok.encode(text) else { continue };
        let _ = tok.decode(&ids);
        let mut stream = StreamDecoder::new(&tok);
        for &id in &ids {
            let _ = stream.push(id);
        }
        let _ = stream.finish();
    }
    // Ids the vocabulary may not hold: decoding them is an error or text, never a panic.
    let _ = tok.decode(&[0, 1, u32::MAX]);
});
