//! The coordinator's state on disk (`CoordinatorConfig::state_dir`): the engine's snapshot
//! (`Engine::snapshot`, what a restarted coordinator needs: membership, epochs, barrier
//! passes, progress records, checkpoints) written whole after every change, atomically (a
//! temporary file, then a rename); read back by [`crate::Coordinator::open`], which restores
//! the engine from it (`Engine::restore`). What is *not* kept is rebuilt by the nodes calling again:
//! barrier arrivals, checkpoint joins and heartbeats are re-sent by nodes reconnecting.

use crate::error::CoordError;
use downpour_core::proto;
use prost::Message;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The state file in a state directory.
pub const STATE_FILE: &str = "state.pb";

/// The state file of `dir`.
pub fn state_path(dir: &Path) -> PathBuf {
    dir.join(STATE_FILE)
}

/// Writes `state` to `dir` atomically; `sync` also forces it to the disk (membership
/// changes; a progress record alone is not worth a disk flush: an older one is still valid).
pub fn write(dir: &Path, state: &proto::CoordinatorState, sync: bool) -> std::io::Result<()> {
    let tmp = dir.join(format!("{STATE_FILE}.tmp"));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&state.encode_to_vec())?;
        if sync {
            f.sync_data()?;
        }
    }
    std::fs::rename(&tmp, state_path(dir))?;
    if sync {
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

/// The state in `dir`, if there is one.
pub fn read(dir: &Path) -> Result<Option<proto::CoordinatorState>, CoordError> {
    let path = state_path(dir);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(CoordError::io("read", path, e)),
    };
    proto::CoordinatorState::decode(bytes.as_slice()).map(Some).map_err(|error| CoordError::CorruptState { path, error })
}
