use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use super::*;
use crate::plugins::python_sources::{Carried, directory_in};

fn carried(text: &str) -> Carried {
    Carried { module: "my_reward".into(), files: BTreeMap::from([("my_reward.py".to_string(), text.to_string())]) }
}

fn age(path: &Path, days: u64) {
    let file = std::fs::File::options().append(true).open(path).unwrap();
    file.set_modified(SystemTime::now() - Duration::from_secs(days * 86_400)).unwrap();
}

const WEEK: Duration = Duration::from_secs(7 * 86_400);

/// A held sources directory (a live plugin's) is kept, its files intact; once dropped, the
/// prune removes it, and the next load writes it again.
#[test]
fn a_sources_directory_a_live_plugin_holds_is_kept_and_the_others_go() {
    let root = tempfile::tempdir().unwrap();
    let live = directory_in(root.path(), &carried("x = 1\n")).unwrap();
    let idle = directory_in(root.path(), &carried("x = 2\n")).unwrap();
    let idle_path = idle.path().to_path_buf();
    drop(idle);
    let pruned = prune(root.path(), WEEK).unwrap();
    assert_eq!(pruned.in_use, vec![live.path().to_path_buf()]);
    assert_eq!(pruned.removed, vec![idle_path.clone()]);
    assert_eq!(pruned.bytes_freed, ("x = 2\n".len() + "my_reward".len()) as u64, "the module and its module-name file");
    assert_eq!(std::fs::read_to_string(live.path().join("my_reward.py")).unwrap(), "x = 1\n", "the live one untouched");
    assert!(!idle_path.exists());
    let entries: Vec<_> = std::fs::read_dir(root.path().join(SOURCES_DIR)).unwrap().flatten().map(|e| e.path()).collect();
    assert_eq!(entries, vec![live.path().to_path_buf()], "no trash left behind");
    let again = directory_in(root.path(), &carried("x = 2\n")).unwrap();
    assert_eq!((again.path(), std::fs::read_to_string(again.path().join("my_reward.py")).unwrap().as_str()), (idle_path.as_path(), "x = 2\n"));
    drop(live);
    assert_eq!(prune(root.path(), WEEK).unwrap().in_use, vec![again.path().to_path_buf()]);
}

/// Bases go when unused for longer than the bound; a cache hit (`mark_used`) renews one;
/// files that are no base stay; an interrupted write's or prune's leftover goes once it is
/// that old.
#[test]
fn bases_unused_past_the_bound_go_and_a_hit_renews_one() {
    let root = tempfile::tempdir().unwrap();
    let builds = root.path().join(BUILDS_DIR);
    std::fs::create_dir_all(&builds).unwrap();
    let [old, renewed, fresh, other] = ["base-a.wasm", "base-b.wasm", "base-c.wasm", "notes.txt"].map(|name| builds.join(name));
    for path in [&old, &renewed, &fresh, &other] {
        std::fs::write(path, b"0123456789").unwrap();
    }
    for path in [&old, &renewed, &other] {
        age(path, 8);
    }
    mark_used(&renewed);
    let leftover = root.path().join(SOURCES_DIR).join("abc.tmp-1-0");
    std::fs::create_dir_all(&leftover).unwrap();
    std::fs::write(leftover.join("my_reward.py"), "x").unwrap();
    let young = root.path().join(SOURCES_DIR).join("def.tmp-2-0");
    std::fs::create_dir_all(&young).unwrap();
    // An interrupted prune's folder, and one a prune is removing now.
    let [interrupted, removing] = ["ghi.pruning-9", "jkl.pruning-8"].map(|name| root.path().join(SOURCES_DIR).join(name));
    for dir in [&interrupted, &removing] {
        std::fs::create_dir_all(dir).unwrap();
    }
    let when = SystemTime::now() - Duration::from_secs(8 * 86_400);
    for dir in [&leftover, &interrupted] {
        std::fs::File::open(dir).unwrap().set_modified(when).unwrap();
    }
    let pruned = prune(root.path(), WEEK).unwrap();
    assert_eq!(pruned.removed, vec![leftover.clone(), interrupted.clone(), old.clone()]);
    assert_eq!(pruned.bytes_freed, 11);
    assert!(renewed.exists() && fresh.exists() && other.exists() && young.exists() && removing.exists());
    assert!(pruned.in_use.is_empty());
}

#[test]
fn an_empty_or_missing_cache_prunes_nothing() {
    let root = tempfile::tempdir().unwrap();
    assert_eq!(prune(root.path(), WEEK).unwrap(), Pruned::default());
}

/// Packages folders (`python-deps/`): one a cached base names stays however old; one a live
/// build holds stays; an unnamed one unused past the bound goes, as does a folder from before
/// the lock file and an orphaned reference (its base gone, so its folder goes too); a young
/// one stays.
#[test]
fn packages_folders_go_when_no_base_names_them_no_build_holds_them_and_they_are_old() {
    let root = tempfile::tempdir().unwrap();
    let (deps, builds) = (root.path().join(DEPS_DIR), root.path().join(BUILDS_DIR));
    std::fs::create_dir_all(&builds).unwrap();
    let [named, held, old, young, orphaned, before_lock] = ["named", "held", "old", "young", "orphaned", "before_lock"].map(|name| deps.join(name));
    for dir in [&named, &held, &old, &young, &orphaned, &before_lock] {
        std::fs::create_dir_all(dir.join("pkg")).unwrap();
        std::fs::write(dir.join("pkg/__init__.py"), "x = 1\n").unwrap();
    }
    let base = builds.join("base-a.wasm");
    std::fs::write(&base, b"base").unwrap();
    refer_to_packages(&base, &named);
    refer_to_packages(&builds.join("base-gone.wasm"), &orphaned);
    let live = crate::plugins::python_deps::hold(&held).unwrap().expect("in place");
    for dir in [&named, &held, &old, &young, &orphaned] {
        drop(crate::plugins::python_deps::hold(dir).unwrap());
    }
    for dir in [&named, &held, &old, &orphaned] {
        age(&dir.join(LOCK_FILE), 8);
    }
    std::fs::File::open(&before_lock).unwrap().set_modified(SystemTime::now() - Duration::from_secs(8 * 86_400)).unwrap();
    let pruned = prune(root.path(), WEEK).unwrap();
    assert_eq!(pruned.removed, vec![builds.join("base-gone.deps"), before_lock.clone(), old.clone(), orphaned.clone()]);
    assert_eq!(pruned.in_use, vec![held.clone()]);
    assert!(named.join("pkg/__init__.py").is_file() && held.join("pkg/__init__.py").is_file() && young.is_dir() && base.is_file());
    let left: Vec<_> = std::fs::read_dir(&deps).unwrap().flatten().map(|e| e.path()).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    assert_eq!(left, vec![held.clone(), named.clone(), young.clone()], "no trash left behind");
    drop(live);
    std::fs::remove_file(&base).unwrap();
    let pruned = prune(root.path(), WEEK).unwrap();
    assert_eq!(pruned.removed, vec![builds.join("base-a.deps"), held, named], "unnamed once its base went, unheld once the build ended");
}
