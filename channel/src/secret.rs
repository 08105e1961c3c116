//! Byte buffers that may hold secrets: wiped on drop, never printed.

use std::fmt;
use std::ops::{Deref, DerefMut};

use zeroize::Zeroizing;

/// Bytes that may be secret (Exec env values, PutFile data, Stdin): the
/// buffer is zeroed when dropped and `Debug` shows only its length.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SecretBytes(Zeroizing<Vec<u8>>);

impl SecretBytes {
    /// Wraps `bytes`; they are wiped when the value is dropped.
    pub fn new(bytes: Vec<u8>) -> Self {
        Self(Zeroizing::new(bytes))
    }

    /// Copies `bytes` into a new secret buffer.
    pub fn copy_from(bytes: &[u8]) -> Self {
        Self::new(bytes.to_vec())
    }
}

impl From<Vec<u8>> for SecretBytes {
    fn from(bytes: Vec<u8>) -> Self {
        Self::new(bytes)
    }
}

impl From<&[u8]> for SecretBytes {
    fn from(bytes: &[u8]) -> Self {
        Self::copy_from(bytes)
    }
}

impl From<&str> for SecretBytes {
    fn from(s: &str) -> Self {
        Self::copy_from(s.as_bytes())
    }
}

impl Deref for SecretBytes {
    type Target = Vec<u8>;
    fn deref(&self) -> &Vec<u8> {
        &self.0
    }
}

impl DerefMut for SecretBytes {
    fn deref_mut(&mut self) -> &mut Vec<u8> {
        &mut self.0
    }
}

impl fmt::Debug for SecretBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<redacted {} bytes>", self.0.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_never_shows_the_secret() {
        let s = SecretBytes::from("hunter2");
        assert_eq!(format!("{s:?}"), "<redacted 7 bytes>");
    }
}
