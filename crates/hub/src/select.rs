//! Which files of a repo a model needs: the config, the weights (every shard an index lists),
//! the tokenizer files and the sentence-transformers files, or the files matching the user's
//! `--include` patterns. Pure functions over the repo's file list; no I/O.

/// Small files fetched when the repo has them: configs, tokenizer and sentence-transformers
/// files, and the shard index.
pub const SMALL_FILES: &[&str] = &[
    "config.json",
    "generation_config.json",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "1_Pooling/config.json",
];

/// The first-stage selection: the [`SMALL_FILES`] present in `siblings`, plus every `.json` or
/// `.safetensors` file inside a module folder of `module_dirs`.
pub fn small_files(siblings: &[String], module_dirs: &[String]) -> Vec<String> {
    let mut out: Vec<String> = siblings
        .iter()
        .filter(|s| SMALL_FILES.contains(&s.as_str()))
        .cloned()
        .collect();
    for dir in module_dirs {
        let prefix = format!("{dir}/");
        out.extend(
            siblings
                .iter()
                .filter(|s| s.starts_with(&prefix))
                .filter(|s| s.ends_with(".json") || s.ends_with(".safetensors"))
                .cloned(),
        );
    }
    out.sort();
    out.dedup();
    out
}

/// The weight files to fetch: the shards named by the index when there is one, else
/// `model.safetensors`, else any top-level `.safetensors`, else the single top-level `.gguf`.
/// `Err` explains an ambiguous or weightless repo.
pub fn weight_files(
    siblings: &[String],
    index_shards: Option<Vec<String>>,
) -> Result<Vec<String>, String> {
    if let Some(shards) = index_shards {
        return Ok(shards);
    }
    let top = |ext: &str| -> Vec<String> {
        siblings
            .iter()
            .filter(|s| !s.contains('/') && s.ends_with(ext))
            .cloned()
            .collect()
    };
    if siblings.iter().any(|s| s == "model.safetensors") {
        return Ok(vec!["model.safetensors".into()]);
    }
    let st = top(".safetensors");
    if !st.is_empty() {
        return Ok(st);
    }
    let gguf = top(".gguf");
    match gguf.len() {
        1 => Ok(gguf),
        0 => Err("the repo has no .safetensors or .gguf weights".into()),
        n => Err(format!(
            "the repo has {n} .gguf files ({}); pick one with --include",
            gguf.join(", ")
        )),
    }
}

/// Whether `path` matches the glob `pattern` (`*` any run of characters, `?` one character);
/// a pattern without `/` also matches the file name alone, as `huggingface-cli --include`
/// patterns are commonly written (`*.gguf`).
pub fn glob_match(pattern: &str, path: &str) -> bool {
    fn go(p: &[u8], s: &[u8]) -> bool {
        let (mut pi, mut si) = (0, 0);
        let (mut star, mut mark) = (None, 0);
        while si < s.len() {
            if pi < p.len() && (p[pi] == b'?' || p[pi] == s[si]) {
                pi += 1;
                si += 1;
            } else if pi < p.len() && p[pi] == b'*' {
                star = Some(pi);
                mark = si;
                pi += 1;
            } else if let Some(st) = star {
                pi = st + 1;
                mark += 1;
                si = mark;
            } else {
                return false;
            }
        }
        p[pi..].iter().all(|&c| c == b'*')
    }
    go(pattern.as_bytes(), path.as_bytes())
        || (!pattern.contains('/')
            && path
                .rsplit('/')
                .next()
                .is_some_and(|name| go(pattern.as_bytes(), name.as_bytes())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn globs() {
        assert!(glob_match("*.gguf", "m-Q4_K_M.gguf"));
        assert!(glob_match("*Q4_K_M*", "sub/m-Q4_K_M.gguf"));
        assert!(glob_match("config.json", "config.json"));
        assert!(glob_match("1_Pooling/*", "1_Pooling/config.json"));
        assert!(!glob_match("*.gguf", "model.safetensors"));
        assert!(glob_match("a?c", "abc") && !glob_match("a?c", "abbc"));
    }

    #[test]
    fn selects_weights() {
        let s = names(&[
            "config.json",
            "model.safetensors",
            "pytorch_model.bin",
            "onnx/model.onnx",
        ]);
        assert_eq!(weight_files(&s, None).unwrap(), ["model.safetensors"]);
        let s = names(&["a-Q4.gguf", "a-Q8.gguf"]);
        assert!(weight_files(&s, None).unwrap_err().contains("--include"));
        let shards = names(&["m-1.safetensors", "m-2.safetensors"]);
        assert_eq!(weight_files(&s, Some(shards.clone())).unwrap(), shards);
    }

    #[test]
    fn selects_small_files() {
        let s = names(&[
            "README.md",
            "config.json",
            "2_Dense/config.json",
            "2_Dense/model.safetensors",
            "1_Pooling/config.json",
            "onnx/model.onnx",
        ]);
        let got = small_files(&s, &names(&["1_Pooling", "2_Dense"]));
        assert_eq!(
            got,
            names(&[
                "1_Pooling/config.json",
                "2_Dense/config.json",
                "2_Dense/model.safetensors",
                "config.json"
            ])
        );
    }
}
