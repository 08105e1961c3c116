//! `boxdesk screenshot NAME OUT.png`: one frame of a sandbox's display,
//! as an 8-bit RGB PNG.
//!
//! This module owns turning a lease's first frame into a file: it waits
//! for the lease's first `present` (the newest frame, whole) at most
//! `--timeout`, reads that slot at the current mode, and writes the PNG
//! beside `OUT` then renames it over `OUT`, so a reader never sees half a
//! file. It must never leave its temporary file behind on an error. Taking
//! the lease ends any other (a `boxdesk view` window closes).

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use boxdesk_platform::screen::Record;
use boxdesk_sandbox::control::client::DisplayLease;
use boxdesk_sandbox::control::ControlClient;

/// `boxdesk screenshot NAME OUT [--timeout SECS]`; `OUT` `-` is stdout.
pub fn screenshot(name: &str, out: &Path, timeout_secs: f64) -> anyhow::Result<i32> {
    let timeout = Duration::try_from_secs_f64(timeout_secs)
        .ok()
        .filter(|t| !t.is_zero())
        .with_context(|| format!("--timeout {timeout_secs}: give a positive number of seconds"))?;
    let (_, paths) = super::sandbox_paths(name)?;
    let client = match ControlClient::connect(&paths.sock, name) {
        Ok(c) => c,
        Err(e) => return Err(super::ls::not_running(name, e)),
    };
    let mut lease = client.display()?;
    let slot = first_frame(&mut lease, name, timeout, timeout_secs)?;
    let (width, height) = lease.size();
    let mut rgb = Vec::with_capacity(width as usize * height as usize * 3);
    for row in lease
        .rows(slot)
        .context("the frame's slot is past the last")?
    {
        for px in row.chunks_exact(4) {
            // XRGB8888, little endian: B, G, R, X.
            rgb.extend_from_slice(&[px[2], px[1], px[0]]);
        }
    }
    drop(lease);
    if out == Path::new("-") {
        let stdout = io::stdout().lock();
        encode(stdout, width, height, &rgb).context("writing the PNG to stdout")?;
    } else {
        write_atomically(out, |f| encode(f, width, height, &rgb))
            .with_context(|| format!("writing {}", out.display()))?;
    }
    Ok(0)
}

/// The slot of the lease's first `present`, waiting at most `timeout`.
fn first_frame(
    lease: &mut DisplayLease,
    name: &str,
    timeout: Duration,
    secs: f64,
) -> anyhow::Result<u32> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lease.next(Some(left))? {
            Some(Record::Present { slot, .. }) => return Ok(slot),
            Some(Record::Mode { .. }) => {}
            Some(Record::End(why)) => {
                bail!("the display of {name} ended ({why}) before it drew a frame")
            }
            None => bail!("{name} has not drawn a frame within {secs} s"),
        }
    }
}

/// Writes `width` x `height` RGB pixels as an 8-bit RGB PNG.
fn encode(out: impl Write, width: u32, height: u32, rgb: &[u8]) -> anyhow::Result<()> {
    let mut buffered = BufWriter::new(out);
    let mut encoder = png::Encoder::new(&mut buffered, width, height);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header()?;
    writer.write_image_data(rgb)?;
    writer.finish()?;
    buffered.flush()?;
    Ok(())
}

/// Writes `path` through a temporary file in the same directory, renamed
/// over it once complete; the temporary file is removed on any error.
fn write_atomically(
    path: &Path,
    write: impl FnOnce(&mut File) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let tmp = temp_beside(path)?;
    let result = (|| {
        let mut file = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        write(&mut file)?;
        file.sync_all()?;
        fs::rename(&tmp, path)?;
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// `DIR/.NAME.PID.tmp` for `DIR/NAME`.
fn temp_beside(path: &Path) -> anyhow::Result<PathBuf> {
    let file = path
        .file_name()
        .with_context(|| format!("{} names no file", path.display()))?;
    let mut tmp = std::ffi::OsString::from(".");
    tmp.push(file);
    tmp.push(format!(".{}.tmp", std::process::id()));
    Ok(path.with_file_name(tmp))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_temporary_file_sits_beside_the_output_and_is_gone_after_a_failed_write() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("shot.png");
        let tmp = temp_beside(&out).unwrap();
        assert_eq!(tmp.parent(), Some(dir.path()));
        assert!(tmp
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with(".shot.png."));
        let e = write_atomically(&out, |_| bail!("boom")).unwrap_err();
        assert_eq!(e.to_string(), "boom");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
        write_atomically(&out, |f| Ok(f.write_all(b"png")?)).unwrap();
        assert_eq!(fs::read(&out).unwrap(), b"png");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
