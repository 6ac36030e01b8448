//! HuggingFace datasets' parquet files through the HF cache: prompts from the SimpleStories
//! dataset (HF Hub `SimpleStories/SimpleStories`, column `story`): the first `prompt_length`
//! tokens of stories, as the original built them; and any dataset's rows as JSON for an
//! environment's `hf-dataset` parameter ([`rows_by_split`]).
//!
//! Stories shorter than `prompt_length` tokens are skipped, prompts are deduplicated on the
//! decoded string, and `num_prompts` are taken in the order of a shuffle seeded by `seed`.

use std::collections::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, ensure};
use hf_hub::{Cache, Repo, RepoType};
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::RowAccessor;

use crate::model::Tokenizer;
use crate::rng::SplitMix64;

/// The dataset researchers draw prompts from.
pub const SIMPLESTORIES: &str = "SimpleStories/SimpleStories";
const STORY_COLUMN: &str = "story";

/// The parquet files of one split (`train`, `test`) of a Hub dataset, fetched into the HF cache
/// (or found there with `HF_HUB_OFFLINE=1`). Files are named `.../<split>-NNNNN-of-NNNNN.parquet`.
pub fn split_files(repo_id: &str, split: &str) -> Result<Vec<PathBuf>> {
    config_split_files(repo_id, None, split)
}

/// [`split_files`] of one configuration (a dataset's subfolder, e.g. GSM8K's `main` beside
/// `socratic`); None: anywhere in the repository.
pub fn config_split_files(repo_id: &str, config: Option<&str>, split: &str) -> Result<Vec<PathBuf>> {
    let repo = Repo::with_revision(repo_id.to_string(), RepoType::Dataset, "main".to_string());
    if crate::model::hub::offline() {
        return cached_split_files(&Cache::from_env(), &repo, repo_id, config, split);
    }
    let api = hf_hub::api::sync::ApiBuilder::from_env().build().map_err(|e| anyhow!("cannot start the HuggingFace Hub client: {e}"))?;
    let repo_api = api.repo(repo.clone());
    let info = repo_api.info().map_err(|e| anyhow!("cannot list dataset {repo_id} on the HuggingFace Hub: {e}. Without network access, set HF_HUB_OFFLINE=1 and use the HF cache, or pass --prompts FILE"))?;
    let in_config = |name: &str| config.is_none_or(|config| name.starts_with(&format!("{config}/")));
    let names: Vec<String> = info.siblings.into_iter().map(|s| s.rfilename).filter(|name| in_config(name) && is_split_file(name, split)).collect();
    ensure!(!names.is_empty(), "dataset {repo_id} has no parquet files for split {split:?}{}", config.map_or(String::new(), |c| format!(" in configuration {c}")));
    names
        .iter()
        .map(|name| repo_api.get(name).map_err(|e| anyhow!("cannot fetch {name} of dataset {repo_id}: {e}")))
        .collect()
}

fn cached_split_files(cache: &Cache, repo: &Repo, repo_id: &str, config: Option<&str>, split: &str) -> Result<Vec<PathBuf>> {
    let folder = cache.path().join(repo.folder_name());
    let commit = std::fs::read_to_string(folder.join("refs").join("main"))
        .with_context(|| format!("dataset {repo_id} is not in the HF cache ({}) and HF_HUB_OFFLINE is set; download it once with network access (`hf download {repo_id} --repo-type dataset`)", folder.display()))?;
    let snapshot = folder.join("snapshots").join(commit.trim());
    let root = config.map_or(snapshot.clone(), |config| snapshot.join(config));
    let mut files = Vec::new();
    collect_split_files(&root, split, &mut files)?;
    ensure!(!files.is_empty(), "{} has no parquet files for split {split:?}", root.display());
    files.sort();
    Ok(files)
}

fn collect_split_files(dir: &Path, split: &str, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            collect_split_files(&path, split, out)?;
        } else if path.file_name().and_then(|n| n.to_str()).is_some_and(|n| is_split_file(n, split)) {
            out.push(path);
        }
    }
    Ok(())
}

fn is_split_file(path: &str, split: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.ends_with(".parquet") && name.starts_with(&format!("{split}-"))
}

/// The splits an environment's `hf-dataset` parameter carries: training prompts come from
/// `train` and evaluation prompts from `test`.
pub const ENVIRONMENT_SPLITS: [&str; 2] = ["train", "test"];

/// The rows of `spec` (`owner/name` or `owner/name:config`) as an `hf-dataset` parameter holds
/// them: `{"repo", "config", "splits": {"train": [row, ...], "test": [...]}}`, each row an object
/// of its columns (parquet's JSON form), in file order.
pub fn rows_by_split(spec: &str) -> Result<serde_json::Value> {
    let (repo_id, config) = match spec.split_once(':') {
        Some((repo, config)) => (repo, Some(config)),
        None => (spec, None),
    };
    ensure!(repo_id.split('/').count() == 2 && config.is_none_or(|c| !c.is_empty() && !c.contains('/')), "hf-dataset {spec:?} is not `owner/name` or `owner/name:config`");
    let mut splits = serde_json::Map::new();
    for split in ENVIRONMENT_SPLITS {
        let files = config_split_files(repo_id, config, split)?;
        let mut rows = Vec::new();
        for path in &files {
            let reader = parquet_reader(path)?;
            for row in reader.get_row_iter(None).with_context(|| format!("cannot read rows of {}", path.display()))? {
                rows.push(row.with_context(|| format!("bad row in {}", path.display()))?.to_json_value());
            }
        }
        splits.insert(split.to_string(), rows.into());
    }
    Ok(serde_json::json!({"repo": repo_id, "config": config, "splits": splits}))
}

fn parquet_reader(path: &Path) -> Result<SerializedFileReader<File>> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    SerializedFileReader::new(file).with_context(|| format!("{} is not a parquet file", path.display()))
}

/// The beginning of every story in the files (enough words for `words` tokens and one more:
/// WordPiece never merges across words, so the first tokens depend only on the first words).
pub fn read_story_openings(files: &[PathBuf], words: usize) -> Result<Vec<String>> {
    let mut openings = Vec::new();
    for_each_story(files, |story| openings.push(opening(story, words)))?;
    Ok(openings)
}

/// Every story in the files, whole (pre-training documents).
pub fn read_stories(files: &[PathBuf]) -> Result<Vec<String>> {
    let mut stories = Vec::new();
    for_each_story(files, |story| stories.push(story.to_string()))?;
    Ok(stories)
}

fn for_each_story(files: &[PathBuf], mut visit: impl FnMut(&str)) -> Result<()> {
    for path in files {
        let reader = parquet_reader(path)?;
        let schema = reader.metadata().file_metadata().schema();
        let index = schema
            .get_fields()
            .iter()
            .position(|f| f.name() == STORY_COLUMN)
            .with_context(|| format!("{} has no `{STORY_COLUMN}` column", path.display()))?;
        for row in reader.get_row_iter(None).with_context(|| format!("cannot read rows of {}", path.display()))? {
            let row = row.with_context(|| format!("bad row in {}", path.display()))?;
            let story = row.get_string(index).with_context(|| format!("{}: `{STORY_COLUMN}` is not a string", path.display()))?;
            visit(story);
        }
    }
    Ok(())
}

/// The text up to the end of its `words`-th whitespace-separated word.
pub fn opening(text: &str, words: usize) -> String {
    let mut seen = 0;
    let mut in_word = false;
    for (i, c) in text.char_indices() {
        if c.is_whitespace() {
            if in_word {
                seen += 1;
                if seen == words {
                    return text[..i].to_string();
                }
            }
            in_word = false;
        } else {
            in_word = true;
        }
    }
    text.to_string()
}

/// Up to `num_prompts` distinct prompts of exactly `prompt_length` tokens, in the order of a
/// shuffle of the stories seeded by `seed`; an error when fewer than `required` exist.
pub fn prompts_from_stories(openings: &[String], tokenizer: &Tokenizer, prompt_length: usize, num_prompts: usize, required: usize, seed: u64) -> Result<Vec<String>> {
    let mut order: Vec<usize> = (0..openings.len()).collect();
    SplitMix64::new(seed).shuffle(&mut order);
    let mut seen = HashSet::new();
    let mut prompts = Vec::with_capacity(num_prompts);
    for index in order {
        let ids = tokenizer.encode(&openings[index])?;
        if ids.len() < prompt_length {
            continue;
        }
        let prompt = tokenizer.decode(&ids[..prompt_length])?;
        if seen.insert(prompt.clone()) {
            prompts.push(prompt);
            if prompts.len() == num_prompts {
                return Ok(prompts);
            }
        }
    }
    ensure!(
        prompts.len() >= required,
        "only {} distinct prompts of {prompt_length} tokens exist in the dataset, {required} are needed; lower num_prompts (training) or eval_samples (evaluation)",
        prompts.len()
    );
    Ok(prompts)
}
