//! llama.cpp's split GGUF: a model cut into files `NAME-00001-of-00003.gguf`, … , each a GGUF file
//! of its own whose `split.*` metadata says which part it is (`split.no`, from 0), how many there
//! are (`split.count`) and how many tensors they hold together (`split.tensors.count`). The first
//! part holds the model's metadata; each part indexes its own tensors, at offsets in its own file.
//!
//! A model is named by its first part; the others' names follow from it ([`part_names`]). The
//! parts are checked against each other ([`merge`]) before any tensor is read, each failure
//! naming the part at fault.

use crate::error::{Error, Result};
use crate::model::gguf::{Gguf, TensorInfo};

/// The most parts a model is read from (llama.cpp's names allow 99999).
pub const MAX_PARTS: u32 = 4096;

/// `-00001-of-00003.gguf`: the part's number and the count, five digits each.
const SUFFIX_LEN: usize = "-00001-of-00003.gguf".len();

/// The part number and count a file name (or a URL's path) ends with, and what precedes them.
fn parse_name(name: &str) -> Option<(&str, u32, u32)> {
    let stem = name.strip_suffix(".gguf")?;
    let at = name.len().checked_sub(SUFFIX_LEN)?;
    let (prefix, tail) = (name.get(..at)?, stem.get(at..)?);
    let digits = |s: &str| (s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse::<u32>().ok()).flatten();
    let rest = tail.strip_prefix('-')?;
    let (no, count) = rest.split_once("-of-")?;
    Some((prefix, digits(no)?, digits(count)?))
}

/// The names of every part of the split model whose first part is `first` (a path, a URL, or an
/// `hf:` name; a URL's query and fragment, and an `hf:` name's `@REVISION`, are kept on each
/// name), or `None` when `first` is not named as a split file. Naming a later part is an error
/// that names the first.
pub fn part_names(first: &str) -> Result<Option<Vec<String>>> {
    let end = first.find(['?', '#']).unwrap_or(first.len());
    let end = match first.rfind('@') {
        Some(at) if first.starts_with("hf:") && first[..at].ends_with(".gguf") => at,
        _ => end,
    };
    let (path, query) = first.split_at(end);
    let Some((prefix, no, count)) = parse_name(path) else { return Ok(None) };
    if count > MAX_PARTS {
        return Err(Error::Unsupported(format!("{first}: a model split into {count} files (at most {MAX_PARTS})")));
    }
    if count == 0 || no == 0 || no > count {
        return Err(Error::invalid_model(format!("{first}: part {no} of {count} is not a split model's part")));
    }
    let name = |i: u32| format!("{prefix}-{i:05}-of-{count:05}.gguf{query}");
    if no != 1 {
        return Err(Error::invalid_model(format!(
            "{first} is part {no} of {count} of a split model: load it by its first part, {}",
            name(1)
        )));
    }
    Ok(Some((1..=count).map(name).collect()))
}

/// What a part's `split.*` metadata says, when it has any.
struct SplitKeys {
    no: u64,
    count: u64,
    tensors: Option<u64>,
}

fn split_keys(g: &Gguf) -> Result<Option<SplitKeys>> {
    if g.get("split.count").is_none() {
        return Ok(None);
    }
    let tensors = g.get("split.tensors.count").map(|_| g.get_u64("split.tensors.count")).transpose()?;
    Ok(Some(SplitKeys { no: g.get_u64("split.no")?, count: g.get_u64("split.count")?, tensors }))
}

/// One model from its parts' headers, in order, each with its name (for errors): the first
/// part's metadata and every part's tensors, and for each tensor the part it lies in. A single
/// file that is not a split part passes through.
pub fn merge(parts: Vec<(String, Gguf)>) -> Result<(Gguf, Vec<usize>)> {
    let n = parts.len();
    if n > MAX_PARTS as usize {
        return Err(Error::Unsupported(format!("a model split into {n} files (at most {MAX_PARTS})")));
    }
    let mut parts = parts.into_iter().enumerate();
    let Some((_, (first_name, mut model))) = parts.next() else {
        return Err(Error::invalid_model("a model needs at least one file"));
    };
    let first = split_keys(&model)?;
    let declared = first.as_ref().map_or(1, |k| k.count);
    if declared != n as u64 {
        let what = match first.as_ref() {
            Some(k) => format!("{first_name} is part {} of a model split into {declared} files", k.no.saturating_add(1)),
            None => format!("{first_name} is a whole model, not a split model's first part"),
        };
        return Err(Error::invalid_model(format!("{what}, but {n} were given (split files load by their first part's name, NAME-00001-of-{declared:05}.gguf)")));
    }
    let mut part_of = vec![0; model.tensors.len()];
    if let Some(k) = &first {
        if k.no != 0 {
            return Err(Error::invalid_model(format!("{first_name} says it is part {} of {}, not the first", k.no.saturating_add(1), k.count)));
        }
        for (i, (name, g)) in parts {
            let mismatch = |what: String| Error::invalid_model(format!("{name} does not belong with {first_name}: {what}"));
            let keys = split_keys(&g)?.ok_or_else(|| mismatch("it has no split.* metadata".into()))?;
            if keys.count != declared || keys.no != i as u64 {
                return Err(mismatch(format!("it says it is part {} of {}, expected part {} of {declared}", keys.no.saturating_add(1), keys.count, i + 1)));
            }
            part_of.extend(std::iter::repeat_n(i, g.tensors.len()));
            model.tensors.extend(g.tensors);
        }
        if let Some(total) = k.tensors.filter(|&t| t != model.tensors.len() as u64) {
            return Err(Error::invalid_model(format!(
                "{first_name} says the model has {total} tensors, its {n} parts hold {}",
                model.tensors.len()
            )));
        }
        check_unique(&model.tensors)?;
    }
    Ok((model, part_of))
}

/// `e`, about the file `name` of a model of `files` files: named when there are several.
pub(crate) fn in_file(name: &str, files: usize, e: Error) -> Error {
    match (files, e) {
        (1, e) => e,
        (_, Error::InvalidModel(m)) => Error::InvalidModel(format!("{name}: {m}")),
        (_, Error::Unsupported(m)) => Error::Unsupported(format!("{name}: {m}")),
        (_, Error::Tokenizer(m)) => Error::Tokenizer(format!("{name}: {m}")),
        (_, e) => Error::invalid_model(format!("{name}: {e}")),
    }
}

/// A tensor named twice (a part given twice, or parts of two models mixed) is refused.
fn check_unique(tensors: &[TensorInfo]) -> Result<()> {
    let mut seen = std::collections::HashSet::with_capacity(tensors.len());
    match tensors.iter().find(|t| !seen.insert(t.name.as_str())) {
        Some(t) => Err(Error::invalid_model(format!("tensor {} is in more than one part of the split model", t.name))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_named_after_the_first() {
        let names = part_names("/m/qwen-00001-of-00003.gguf").unwrap().unwrap();
        assert_eq!(names, ["/m/qwen-00001-of-00003.gguf", "/m/qwen-00002-of-00003.gguf", "/m/qwen-00003-of-00003.gguf"]);
        let urls = part_names("https://h/r/m-00001-of-00002.gguf?download=1").unwrap().unwrap();
        assert_eq!(urls[1], "https://h/r/m-00002-of-00002.gguf?download=1");
        assert!(part_names("/m/model.gguf").unwrap().is_none());
        assert!(part_names("/m/model-1-of-3.gguf").unwrap().is_none());
        let e = part_names("/m/qwen-00002-of-00003.gguf").unwrap_err().to_string();
        assert!(e.contains("qwen-00001-of-00003.gguf"), "{e}");
        assert!(part_names("/m/q-00001-of-00000.gguf").is_err());
        let hf = part_names("hf:o/r/m-00001-of-00002.gguf@v1.2").unwrap().unwrap();
        assert_eq!(hf, ["hf:o/r/m-00001-of-00002.gguf@v1.2", "hf:o/r/m-00002-of-00002.gguf@v1.2"]);
        assert!(part_names("hf:o/r/m.gguf@v1").unwrap().is_none());
    }
}
