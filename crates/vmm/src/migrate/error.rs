//! Why a live migration failed at the source. The messages are what the
//! summary's `failed` field and stderr say.

use super::link::{Kind, LinkError};
use crate::units::format_duration;
use hv::snapshot::SnapshotError;
use hv::{DirtyLogError, GuestMemoryError};
use std::time::Duration;

/// A migration's failure at the source.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("connecting to {to}: {source}")]
    Connect { to: String, source: LinkError },
    /// Sending or receiving on the migration connection.
    #[error(transparent)]
    Link(#[from] LinkError),
    #[error("dirty log: {0}")]
    DirtyLog(#[from] DirtyLogError),
    #[error("reading guest page {gfn:#x}: {source}")]
    ReadPage { gfn: u64, source: GuestMemoryError },
    /// Saving the VM's state for the destination.
    #[error(transparent)]
    State(#[from] SnapshotError),
    /// The guest stopped, a limit or a signal ended the run meanwhile.
    #[error("the run ended during pre-copy")]
    RunEnded,
    #[error("the destination refused the VM: {0}")]
    Refused(String),
    #[error("the destination answered {0:?}")]
    UnexpectedAnswer(Kind),
    #[error("no answer from the destination within {}", format_duration(*.0))]
    NoAnswer(Duration),
    #[error("waiting for the destination's answer: {0}")]
    Answer(LinkError),
    /// Post-copy: the thread that reads the destination's page requests.
    #[error("the return path: {0}")]
    ReturnPath(std::io::Error),
    #[error("the connection: {0}")]
    ReturnPathBlocking(std::io::Error),
    #[error("starting the reader: {0}")]
    SpawnReader(std::io::Error),
    #[error("every page sent, but no word from the destination in {0:?}")]
    Silent(Duration),
    #[error("the connection broke ({why}); reconnecting: {source}")]
    Reconnect {
        why: String,
        source: Box<MigrateError>,
    },
    #[error("no destination within {within:?} (last: {last})")]
    NoDestination { within: Duration, last: String },
}

impl MigrateError {
    /// The destination's answer to the VM sent whole (`Ack`: it runs
    /// there now).
    pub fn from_answer(answer: Result<(Kind, Vec<u8>), LinkError>) -> Result<(), MigrateError> {
        match answer {
            Ok((Kind::Ack, _)) => Ok(()),
            Ok((Kind::Nack, why)) => Err(MigrateError::Refused(
                String::from_utf8_lossy(&why).into_owned(),
            )),
            Ok((kind, _)) => Err(MigrateError::UnexpectedAnswer(kind)),
            Err(LinkError::Timeout(waited)) => Err(MigrateError::NoAnswer(waited)),
            Err(e) => Err(MigrateError::Answer(e)),
        }
    }
}
