//! The error of a session: transport failures, a bad header and bad frames.

use crate::frame::FrameError;

/// Why a session could not go on.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    /// The transport failed.
    #[error("channel i/o: {0}")]
    Io(std::io::Error),
    /// The peer closed the stream in the middle of a header or frame.
    #[error("peer closed the stream in the middle of {0}")]
    UnexpectedEof(&'static str),
    /// The peer's session header does not start with `AGCH`.
    #[error("not an AGCH peer (magic {0:02x?})")]
    BadMagic([u8; 4]),
    /// The peer speaks another protocol version.
    #[error("peer speaks AGCH version {0}, this side speaks 3")]
    UnsupportedVersion(u16),
    /// A frame was malformed.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// The hybrid vsock socket refused the `CONNECT` preamble.
    #[error("hybrid vsock socket refused CONNECT: {0}")]
    HybridRefused(String),
}

/// By hand, not `#[from]`: the cause is in the message, so it is not a
/// `source()` too (a `{e:#}` chain prints it once).
impl From<std::io::Error> for ChannelError {
    fn from(e: std::io::Error) -> Self {
        ChannelError::Io(e)
    }
}

impl ChannelError {
    /// True when the session ended because of what the peer sent (as
    /// opposed to a local transport failure): the agent answers these with
    /// an Error frame before it closes.
    pub fn is_protocol_error(&self) -> bool {
        matches!(
            self,
            Self::BadMagic(_) | Self::UnsupportedVersion(_) | Self::Frame(_)
        )
    }
}
