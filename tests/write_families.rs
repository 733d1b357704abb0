//! The random-weight family models of tests/util/families.rs: each is deterministic (pinned by a
//! hash, since the llama.cpp references in tests/golden/families/ were made from exactly these
//! bytes), parses, carries a vocabulary the tokenizer accepts and tokenizes as llama.cpp does, and
//! agrees with its reference file on the prompts.
//!
//! With `SAGUARO_WRITE_FAMILIES=<dir>` it also writes `<dir>/<family>.gguf` and the reference
//! tool's input `<dir>/<family>.spec` (scripts/reference/make-references.sh does this).

mod util;

use saguaro::model::gguf::Gguf;
use saguaro::model::tokenizer::Tokenizer;
use util::families::{family_gguf, family_prompts, family_spec, fnv1a64, shape, vocab_size, FAMILIES, TOKENIZER_TEXTS};

/// FNV-1a 64 of each generated file, as the references were made from. A change here means the
/// references must be made again (scripts/reference/make-references.sh).
const HASHES: [(&str, u64); 4] = [
    ("qwen3", 0x0ec4_9b58_384a_2ab1),
    ("llama3", 0x0ebb_8ceb_b017_914d),
    ("phi3", 0x4e2e_2ee7_d07e_f617),
    ("gemma3", 0xd093_2114_16e9_5ffe),
];

#[test]
fn family_files_are_deterministic_and_parse() {
    let write_dir = std::env::var_os("SAGUARO_WRITE_FAMILIES").map(std::path::PathBuf::from);
    for name in FAMILIES {
        let bytes = family_gguf(name);
        assert_eq!(bytes, family_gguf(name), "{name}: two generations differ");
        let hash = fnv1a64(&bytes);
        eprintln!("{name}: {} bytes, fnv1a64 {hash:#018x}", bytes.len());

        let s = shape(name);
        let g = Gguf::parse(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(g.get_str("general.architecture"), Some(s.arch));
        let embd = g
            .tensors
            .iter()
            .find(|t| t.name == "token_embd.weight")
            .expect("token_embd.weight");
        assert_eq!(
            embd.dims,
            [s.d_model, vocab_size(&s)],
            "{name}: embedding rows = vocabulary"
        );
        let tok = Tokenizer::from_gguf(&g).unwrap_or_else(|e| panic!("{name}: tokenizer: {e}"));
        let ids = tok.encode(" the cat").unwrap();
        assert_eq!(tok.decode(&ids).unwrap(), " the cat", "{name}");

        if let Some(dir) = &write_dir {
            // Writing the inputs of new references: the old ones need not match.
            std::fs::create_dir_all(dir).unwrap();
            std::fs::write(dir.join(format!("{name}.gguf")), &bytes).unwrap();
            std::fs::write(dir.join(format!("{name}.spec")), family_spec(name)).unwrap();
            continue;
        }
        let want = HASHES.iter().find(|(n, _)| *n == name).unwrap().1;
        assert_eq!(
            hash, want,
            "{name}: the generated file changed; its reference in tests/golden/families is stale"
        );
        let golden = util::golden(&format!("families/{name}"));
        let prompts = family_prompts(name);
        assert_eq!(golden.cases.len(), prompts.len(), "{name}: reference cases");
        for (case, (_, ids)) in golden.cases.iter().zip(&prompts) {
            assert_eq!(
                &case.prompt_ids, ids,
                "{name}: the reference was made from other prompts"
            );
        }
        assert_eq!(
            golden.tokenizer.len(),
            TOKENIZER_TEXTS.len(),
            "{name}: reference tokenizer cases"
        );
        for tc in &golden.tokenizer {
            assert_eq!(
                tok.encode(&tc.text).unwrap(),
                tc.ids,
                "{name}: tokenizing {:?}",
                tc.text
            );
        }
    }
}
