//! Checkpoints on disk. A checkpoint is a directory `ckpt-NNNNNN` under the job's
//! `--checkpoint-dir` holding one part per server (`part-NODE.pb`, a
//! [`proto::CheckpointPart`]: the rows of every table that server answers for, with their
//! update-rule state) and `manifest.pb` ([`proto::CheckpointManifest`]: the parts and where
//! every worker stood). It is built as `ckpt-NNNNNN.tmp`, every file fsynced, the manifest
//! written last, then renamed: a directory without a manifest, or still named `.tmp`, is
//! never used, so a checkpoint cut short by a crash is ignored.
//!
//! This is the one core module that touches the file system (plain files: no network, no
//! threads); the protocol that decides when a checkpoint is taken lives in the coordinator
//! and the worker session.

use crate::error::{CoreError, Result};
use crate::proto;
use prost::Message;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The manifest's file name inside a checkpoint directory.
pub const MANIFEST: &str = "manifest.pb";

/// Name of complete checkpoint `number`.
pub fn dir_name(number: u64) -> String {
    format!("ckpt-{number:06}")
}

/// Name of checkpoint `number` while it is being written.
pub fn tmp_name(number: u64) -> String {
    format!("ckpt-{number:06}.tmp")
}

/// Name of node `node`'s part.
pub fn part_name(node: u32) -> String {
    format!("part-{node}.pb")
}

/// The number of a complete checkpoint's directory name (`ckpt-N`), else `None`.
fn number_of(name: &str) -> Option<u64> {
    let n = name.strip_prefix("ckpt-")?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    n.parse().ok()
}

/// Whether `name` is a checkpoint directory being written (`ckpt-N.tmp`): the only names
/// a server agrees to write a part into.
pub fn is_tmp_name(name: &str) -> bool {
    name.strip_suffix(".tmp").and_then(number_of).is_some()
}

fn io_err(what: &str, path: &Path, e: std::io::Error) -> CoreError {
    CoreError::Checkpoint(format!("{what} {}: {e}", path.display()))
}

/// Writes `bytes` to `path` and flushes them to the disk.
pub fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = std::fs::File::create(path).map_err(|e| io_err("cannot create", path, e))?;
    f.write_all(bytes).map_err(|e| io_err("cannot write", path, e))?;
    f.sync_all().map_err(|e| io_err("cannot sync", path, e))
}

/// Checkpoint numbers found in `dir`: (complete ones, highest number of any, tmp included).
fn scan(dir: &Path) -> Result<(Vec<u64>, u64)> {
    let mut complete = Vec::new();
    let mut highest = 0;
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((complete, 0)),
        Err(e) => return Err(io_err("cannot list", dir, e)),
    };
    for entry in rd {
        let entry = entry.map_err(|e| io_err("cannot list", dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(n) = number_of(&name) {
            highest = highest.max(n);
            if entry.path().join(MANIFEST).is_file() {
                complete.push(n);
            }
        } else if let Some(n) = name.strip_suffix(".tmp").and_then(number_of) {
            highest = highest.max(n);
        }
    }
    complete.sort_unstable();
    Ok((complete, highest))
}

/// The number the next checkpoint in `dir` gets: past every complete or unfinished one.
pub fn next_number(dir: &Path) -> Result<u64> {
    Ok(scan(dir)?.1 + 1)
}

/// The newest complete checkpoint in `dir`, if any.
pub fn latest(dir: &Path) -> Result<Option<PathBuf>> {
    Ok(scan(dir)?.0.last().map(|n| dir.join(dir_name(*n))))
}

/// The checkpoint `path` names: `path` itself when it is a complete checkpoint, else the
/// newest complete checkpoint in it; an error says why there is none.
pub fn resolve(path: &Path) -> Result<PathBuf> {
    if path.join(MANIFEST).is_file() {
        return Ok(path.to_path_buf());
    }
    if !path.is_dir() {
        return Err(CoreError::Checkpoint(format!("{} is not a directory", path.display())));
    }
    latest(path)?.ok_or_else(|| {
        CoreError::Checkpoint(format!("{} holds no complete checkpoint (a ckpt-N directory with a {MANIFEST})", path.display()))
    })
}

/// Completes checkpoint `number` in `dir`: writes its manifest into the `.tmp` directory,
/// renames it to its final name and syncs `dir`. Returns the checkpoint's path.
pub fn finalize(dir: &Path, number: u64, manifest: &proto::CheckpointManifest) -> Result<PathBuf> {
    let tmp = dir.join(tmp_name(number));
    write_synced(&tmp.join(MANIFEST), &manifest.encode_to_vec())?;
    let done = dir.join(dir_name(number));
    std::fs::rename(&tmp, &done).map_err(|e| io_err("cannot rename", &tmp, e))?;
    if let Ok(d) = std::fs::File::open(dir) {
        // the rename itself is durable once the directory is
        d.sync_all().map_err(|e| io_err("cannot sync", dir, e))?;
    }
    Ok(done)
}

/// Removes all but the newest `keep` complete checkpoints of `dir`, and unfinished ones
/// older than the newest complete one (left by a crash). Returns how many were removed.
pub fn prune(dir: &Path, keep: usize) -> Result<usize> {
    let (complete, _) = scan(dir)?;
    let Some(&newest) = complete.last() else { return Ok(0) };
    let mut removed = 0;
    let old = complete.len().saturating_sub(keep.max(1));
    let mut doomed: Vec<PathBuf> = complete[..old].iter().map(|n| dir.join(dir_name(*n))).collect();
    for entry in std::fs::read_dir(dir).map_err(|e| io_err("cannot list", dir, e))?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.strip_suffix(".tmp").and_then(number_of).is_some_and(|n| n < newest) {
            doomed.push(entry.path());
        }
    }
    for d in doomed {
        std::fs::remove_dir_all(&d).map_err(|e| io_err("cannot remove", &d, e))?;
        removed += 1;
    }
    Ok(removed)
}

fn read_message<M: Message + Default>(path: &Path) -> Result<M> {
    let bytes = std::fs::read(path).map_err(|e| io_err("cannot read", path, e))?;
    M::decode(bytes.as_slice()).map_err(|e| CoreError::Checkpoint(format!("{} is corrupt: {e}", path.display())))
}

/// Reads a checkpoint's manifest.
pub fn read_manifest(ckpt: &Path) -> Result<proto::CheckpointManifest> {
    read_message(&ckpt.join(MANIFEST))
}

/// Reads every part a checkpoint's manifest lists.
pub fn read_parts(ckpt: &Path, manifest: &proto::CheckpointManifest) -> Result<Vec<proto::CheckpointPart>> {
    manifest
        .parts
        .iter()
        .map(|name| {
            if name.contains(['/', '\\']) || name.starts_with('.') {
                return Err(CoreError::Checkpoint(format!("{}: bad part name {name:?}", ckpt.join(MANIFEST).display())));
            }
            read_message(&ckpt.join(name))
        })
        .collect()
}

/// A table's rows for a part: `keys` sorted, `rows` holding `row_len` floats per key.
pub fn encode_table(spec: proto::TableSpec, row_len: usize, keys: &[u64], rows: &[f32]) -> proto::CheckpointTable {
    proto::CheckpointTable {
        spec: Some(spec),
        row_len: row_len as u32,
        keys: bytemuck::cast_slice::<u64, u8>(keys).to_vec().into(),
        rows: bytemuck::cast_slice::<f32, u8>(rows).to_vec().into(),
    }
}

/// A part's table back as (keys, rows), checked: lengths agree and keys are sorted.
pub fn decode_table(t: &proto::CheckpointTable) -> Result<(Vec<u64>, Vec<f32>)> {
    let bad = |why: String| CoreError::Checkpoint(format!("table {}: {why}", t.spec.as_ref().map(|s| s.id).unwrap_or(0)));
    if !t.keys.len().is_multiple_of(8) || !t.rows.len().is_multiple_of(4) {
        return Err(bad("key or row bytes are not whole numbers".into()));
    }
    let keys: Vec<u64> = t.keys.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default())).collect();
    let rows: Vec<f32> = t.rows.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap_or_default())).collect();
    if rows.len() != keys.len() * t.row_len as usize {
        return Err(bad(format!(
            "{} keys of {} floats need {} floats, found {}",
            keys.len(),
            t.row_len,
            keys.len() * t.row_len as usize,
            rows.len()
        )));
    }
    crate::keys::check_sorted_unique(&keys).map_err(|e| bad(e.to_string()))?;
    Ok((keys, rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(number: u64) -> proto::CheckpointManifest {
        proto::CheckpointManifest { number, parts: vec![part_name(1)], num_workers: 1, ..Default::default() }
    }

    fn tempdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("downpour-ckpt-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn an_unfinished_checkpoint_is_never_the_latest_and_numbers_move_past_it() {
        let d = tempdir("latest");
        assert_eq!(latest(&d).unwrap(), None);
        assert!(resolve(&d).unwrap_err().to_string().contains("no complete checkpoint"));
        std::fs::create_dir_all(d.join(tmp_name(1))).unwrap();
        finalize(&d, 1, &manifest(1)).unwrap();
        // checkpoint 2 was cut short after its parts, before its manifest
        std::fs::create_dir_all(d.join(tmp_name(2))).unwrap();
        write_synced(&d.join(tmp_name(2)).join(part_name(1)), b"half").unwrap();
        // a directory with the final name but no manifest (copied by hand, say) is not complete
        std::fs::create_dir_all(d.join(dir_name(3))).unwrap();
        assert_eq!(latest(&d).unwrap(), Some(d.join(dir_name(1))));
        assert_eq!(resolve(&d).unwrap(), d.join(dir_name(1)));
        assert_eq!(resolve(&d.join(dir_name(1))).unwrap(), d.join(dir_name(1)));
        assert_eq!(next_number(&d).unwrap(), 4);
        assert_eq!(read_manifest(&d.join(dir_name(1))).unwrap().number, 1);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn pruning_keeps_the_newest_complete_checkpoints_and_the_one_being_written() {
        let d = tempdir("prune");
        for n in 1..=5 {
            std::fs::create_dir_all(d.join(tmp_name(n))).unwrap();
            finalize(&d, n, &manifest(n)).unwrap();
        }
        std::fs::create_dir_all(d.join(tmp_name(3))).unwrap(); // a crash's leftover
        std::fs::create_dir_all(d.join(tmp_name(6))).unwrap(); // being written
        assert_eq!(prune(&d, 2).unwrap(), 4);
        let mut left: Vec<String> = std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        left.sort();
        assert_eq!(left, vec![dir_name(4), dir_name(5), tmp_name(6)]);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn only_tmp_checkpoint_names_are_writable_by_request() {
        assert!(is_tmp_name("ckpt-000004.tmp"));
        for bad in ["ckpt-000004", "../ckpt-1.tmp", "ckpt-.tmp", "ckpt-1/../../x.tmp", "x.tmp", "ckpt-1a.tmp"] {
            assert!(!is_tmp_name(bad), "{bad}");
        }
    }

    #[test]
    fn a_table_round_trips_and_a_corrupt_one_is_refused() {
        let spec = proto::TableSpec { id: 7, ..Default::default() };
        let t = encode_table(spec, 2, &[1, 5, 9], &[1.0, 0.5, 2.0, 0.5, 3.0, 0.5]);
        assert_eq!(decode_table(&t).unwrap(), (vec![1, 5, 9], vec![1.0, 0.5, 2.0, 0.5, 3.0, 0.5]));
        let mut short = t.clone();
        short.rows.truncate(8);
        assert!(decode_table(&short).unwrap_err().to_string().contains("table 7"));
        let mut unsorted = t;
        unsorted.keys = bytemuck::cast_slice::<u64, u8>(&[5u64, 1, 9]).to_vec().into();
        assert!(decode_table(&unsorted).is_err());
        let d = tempdir("corrupt");
        write_synced(&d.join(MANIFEST), b"\xff\xff\xff").unwrap();
        assert!(read_manifest(&d).unwrap_err().to_string().contains("is corrupt"));
        let _ = std::fs::remove_dir_all(&d);
    }
}
