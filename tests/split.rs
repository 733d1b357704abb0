//! A model cut into three files as llama.cpp's gguf-split cuts it (`NAME-00001-of-00003.gguf`,
//! … , with the `split.*` keys) loads from its first part's path (each part memory-mapped) and
//! streamed part by part, and gives the very tokens of the whole file; a missing, foreign,
//! repeated or truncated part is refused with an error that names it.

mod util;

use std::path::{Path, PathBuf};

use futures::executor::block_on;
use saguaro::backend::cpu::CpuBackend;
use saguaro::decode::Mode;
use saguaro::engine::{Engine, EngineOptions, GenerateOptions, PlacedTarget, Prompt, Target};
use saguaro::model::gguf::Gguf;
use saguaro::model::gguf_writer::GgufWriter;
use saguaro::model::load::{open, ModelFile};
use saguaro::model::stream::{GgufStream, StreamedModel};
use util::*;

fn whole_file() -> Vec<u8> {
    std::fs::read(root().join("models").join(format!("{SMOLLM2}.gguf"))).expect("run scripts/fetch-models.sh first")
}

/// `file` cut into `n` parts, written into a fresh directory `dir` as `NAME-0000i-of-0000n.gguf`.
fn write_parts(file: &[u8], n: usize, dir: &str) -> Vec<PathBuf> {
    let dir = std::env::temp_dir().join(format!("saguaro-split-{dir}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let g = Gguf::parse(file).unwrap();
    GgufWriter::from_gguf(&g, file)
        .split(n)
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let path = dir.join(format!("smollm-{:05}-of-{n:05}.gguf", i + 1));
            std::fs::write(&path, w.build()).unwrap();
            path
        })
        .collect()
}

const PROMPT: &str = "The capital of France is";

fn tokens(target: Target) -> Vec<u32> {
    let opts = EngineOptions { context: 128, auto: false, ..EngineOptions::default() };
    let mut engine = block_on(Engine::with_target_wrapper(target, None, &opts, |lm| lm)).unwrap();
    let g = GenerateOptions { mode: Some(Mode::Ar), max_tokens: 16, ..GenerateOptions::default() };
    block_on(engine.generate(&Prompt::Text(PROMPT.into()), &g, &mut |_, _| true)).unwrap().tokens
}

fn file_tokens(file: ModelFile) -> Vec<u32> {
    tokens(Target::File(file))
}

/// The parts streamed as the browser streams them: each part's first bytes until its header is
/// read, then each part's rest in pieces of `piece` bytes.
fn stream(parts: &[Vec<u8>], piece: usize) -> saguaro::Result<StreamedModel<CpuBackend>> {
    let named = parts.iter().enumerate().map(|(i, p)| (format!("part {}", i + 1), Some(p.len() as u64))).collect();
    let mut s = GgufStream::with_parts(CpuBackend::new(1).unwrap(), named);
    let mut at = vec![0; parts.len()];
    for (i, p) in parts.iter().enumerate() {
        while s.needs_header(i) && at[i] < p.len() {
            let n = piece.min(p.len() - at[i]);
            s.push_to(i, &p[at[i]..at[i] + n])?;
            at[i] += n;
        }
    }
    for (i, p) in parts.iter().enumerate() {
        for chunk in p[at[i]..].chunks(piece) {
            s.push_to(i, chunk)?;
        }
    }
    s.finish()
}

fn streamed_tokens(m: StreamedModel<CpuBackend>) -> Vec<u32> {
    let opts = EngineOptions { context: 128, auto: false, ..EngineOptions::default() };
    tokens(Target::Placed(PlacedTarget::new(m, &opts, |r| Box::new(r)).unwrap()))
}

fn err(path: &Path) -> String {
    match open(path) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn three_parts_give_the_whole_files_tokens_mapped_and_streamed() {
    let file = whole_file();
    let want = file_tokens(open(&root().join("models").join(format!("{SMOLLM2}.gguf"))).unwrap());
    let parts = write_parts(&file, 3, "same");
    assert!(parts.iter().all(|p| std::fs::metadata(p).unwrap().len() > 1 << 20), "every part holds tensors");
    assert_eq!(file_tokens(open(&parts[0]).unwrap()), want, "the split model from its first part's path");

    let bytes: Vec<Vec<u8>> = parts.iter().map(|p| std::fs::read(p).unwrap()).collect();
    // Pieces smaller than a header try and larger than a part's header.
    for piece in [65_536, 3 << 20] {
        assert_eq!(streamed_tokens(stream(&bytes, piece).unwrap()), want, "streamed in pieces of {piece} bytes");
    }
}

#[test]
fn missing_foreign_and_misnamed_parts_are_refused_by_name() {
    let file = whole_file();
    let parts = write_parts(&file, 3, "bad");
    let bytes: Vec<Vec<u8>> = parts.iter().map(|p| std::fs::read(p).unwrap()).collect();

    // A later part named: the error names the first.
    let e = err(&parts[1]);
    assert!(e.contains("smollm-00001-of-00003.gguf"), "{e}");

    // The first part under a name that is not a split name: it says what it is.
    let lone = parts[0].with_file_name("smollm-first.gguf");
    std::fs::copy(&parts[0], &lone).unwrap();
    let e = err(&lone);
    assert!(e.contains("part 1 of a model split into 3 files"), "{e}");

    // A part of another cut of the model (into two) in the place of part 2.
    let two = write_parts(&file, 2, "two");
    std::fs::copy(&two[1], &parts[1]).unwrap();
    let e = err(&parts[0]);
    assert!(e.contains("smollm-00002-of-00003.gguf") && e.contains("part 2 of 2, expected part 2 of 3"), "{e}");

    // Part 3 given again as part 2.
    std::fs::copy(&parts[2], &parts[1]).unwrap();
    let e = err(&parts[0]);
    assert!(e.contains("smollm-00002-of-00003.gguf") && e.contains("part 3 of 3, expected part 2 of 3"), "{e}");

    // A whole model in the place of a part.
    std::fs::write(&parts[1], &file).unwrap();
    let e = err(&parts[0]);
    assert!(e.contains("smollm-00002-of-00003.gguf") && e.contains("no split.* metadata"), "{e}");

    // Part 3 missing.
    std::fs::write(&parts[1], &bytes[1]).unwrap();
    std::fs::remove_file(&parts[2]).unwrap();
    let e = err(&parts[0]);
    assert!(e.contains("smollm-00003-of-00003.gguf") && e.contains("missing"), "{e}");

    // A count no loader would open so many files for is refused before any is opened.
    let e = err(&parts[0].with_file_name("smollm-00001-of-99999.gguf"));
    assert!(e.contains("99999 files"), "{e}");
}

/// More than a part's header (SmolLM2's vocabulary takes a few MB).
const HEAD: usize = 4 << 20;

#[test]
fn short_and_out_of_order_streams_name_the_part() {
    let file = whole_file();
    let parts = write_parts(&file, 3, "stream");
    let mut bytes: Vec<Vec<u8>> = parts.iter().map(|p| std::fs::read(p).unwrap()).collect();

    // Two parts given where the first says three.
    let e = stream(&bytes[..2], 1 << 20).err().unwrap().to_string();
    assert!(e.contains("split into 3 files, but 2 were given"), "{e}");

    // Part 2 cut short: it is named, with the tensor it ended before.
    let whole_len = bytes[1].len();
    bytes[1].truncate(whole_len - 1000);
    let named: Vec<_> = (0..bytes.len()).map(|i| (format!("part {}", i + 1), None)).collect();
    let mut s = GgufStream::with_parts(CpuBackend::new(1).unwrap(), named);
    for (i, p) in bytes.iter().enumerate() {
        s.push_to(i, &p[..HEAD]).unwrap();
        assert!(!s.needs_header(i));
    }
    s.push_to(0, &bytes[0][HEAD..]).unwrap();
    s.push_to(1, &bytes[1][HEAD..]).unwrap();
    let e = s.push_to(2, &bytes[2][HEAD..]).unwrap_err().to_string();
    assert!(e.contains("part 2 is truncated") && e.contains("before tensor"), "{e}");

    // A part shorter than its announced length is refused at its header, which says so.
    let named = bytes.iter().enumerate().map(|(i, p)| (format!("part {}", i + 1), Some(p.len() as u64))).collect();
    let mut s = GgufStream::with_parts(CpuBackend::new(1).unwrap(), named);
    s.push_to(0, &bytes[0][..HEAD]).unwrap();
    let e = s.push_to(1, &bytes[1][..HEAD]).unwrap_err().to_string();
    assert!(e.starts_with("invalid model file: part 2: GGUF tensor") && e.contains("extend past the end of the file"), "{e}");

    // Part 3's rest before part 1's, the lengths announced.
    bytes[1] = std::fs::read(&parts[1]).unwrap();
    let named = bytes.iter().enumerate().map(|(i, p)| (format!("part {}", i + 1), Some(p.len() as u64))).collect();
    let mut s = GgufStream::with_parts(CpuBackend::new(1).unwrap(), named);
    for (i, p) in bytes.iter().enumerate() {
        s.push_to(i, &p[..HEAD]).unwrap();
    }
    let e = s.push_to(2, &bytes[2][HEAD..]).unwrap_err().to_string();
    assert!(e.contains("part 3's bytes arrived before part 1 was whole"), "{e}");
}
