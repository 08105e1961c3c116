//! The virtio-gpu 2D command set as bytes (virtio 1.2 §5.7.6): a request's
//! readable bytes → [`Header`] + [`Command`], a [`Response`] → the bytes
//! the driver reads. Pure: no guest memory, no state.
//!
//! It must never panic on any input and never allocate more than
//! [`MAX_ENTRIES`] backing entries for one request (their count is checked
//! against [`MAX_ENTRIES`] and against the bytes present before any
//! allocation). Every field is little endian.

use virtio_bindings::virtio_gpu::{
    virtio_gpu_ctrl_type_VIRTIO_GPU_CMD_GET_DISPLAY_INFO as CMD_GET_DISPLAY_INFO,
    virtio_gpu_ctrl_type_VIRTIO_GPU_CMD_MOVE_CURSOR as CMD_MOVE_CURSOR,
    virtio_gpu_ctrl_type_VIRTIO_GPU_CMD_RESOURCE_ATTACH_BACKING as CMD_RESOURCE_ATTACH_BACKING,
    virtio_gpu_ctrl_type_VIRTIO_GPU_CMD_RESOURCE_CREATE_2D as CMD_RESOURCE_CREATE_2D,
    virtio_gpu_ctrl_type_VIRTIO_GPU_CMD_RESOURCE_DETACH_BACKING as CMD_RESOURCE_DETACH_BACKING,
    virtio_gpu_ctrl_type_VIRTIO_GPU_CMD_RESOURCE_FLUSH as CMD_RESOURCE_FLUSH,
    virtio_gpu_ctrl_type_VIRTIO_GPU_CMD_RESOURCE_UNREF as CMD_RESOURCE_UNREF,
    virtio_gpu_ctrl_type_VIRTIO_GPU_CMD_SET_SCANOUT as CMD_SET_SCANOUT,
    virtio_gpu_ctrl_type_VIRTIO_GPU_CMD_TRANSFER_TO_HOST_2D as CMD_TRANSFER_TO_HOST_2D,
    virtio_gpu_ctrl_type_VIRTIO_GPU_CMD_UPDATE_CURSOR as CMD_UPDATE_CURSOR,
    virtio_gpu_ctrl_type_VIRTIO_GPU_RESP_ERR_INVALID_PARAMETER as RESP_ERR_INVALID_PARAMETER,
    virtio_gpu_ctrl_type_VIRTIO_GPU_RESP_ERR_INVALID_RESOURCE_ID as RESP_ERR_INVALID_RESOURCE_ID,
    virtio_gpu_ctrl_type_VIRTIO_GPU_RESP_ERR_INVALID_SCANOUT_ID as RESP_ERR_INVALID_SCANOUT_ID,
    virtio_gpu_ctrl_type_VIRTIO_GPU_RESP_ERR_OUT_OF_MEMORY as RESP_ERR_OUT_OF_MEMORY,
    virtio_gpu_ctrl_type_VIRTIO_GPU_RESP_ERR_UNSPEC as RESP_ERR_UNSPEC,
    virtio_gpu_ctrl_type_VIRTIO_GPU_RESP_OK_DISPLAY_INFO as RESP_OK_DISPLAY_INFO,
    virtio_gpu_ctrl_type_VIRTIO_GPU_RESP_OK_NODATA as RESP_OK_NODATA, VIRTIO_GPU_FLAG_FENCE,
    VIRTIO_GPU_FLAG_INFO_RING_IDX, VIRTIO_GPU_MAX_SCANOUTS,
};

/// Bytes of the control header every request and response starts with.
pub const HEADER_LEN: usize = 24;
/// Bytes of one backing entry (`addr` u64, `length` u32, padding).
pub const ENTRY_LEN: usize = 16;
/// Most backing entries in one `RESOURCE_ATTACH_BACKING` (a 64 MiB
/// resource in scattered 4 KiB pages).
pub const MAX_ENTRIES: u32 = 16384;
/// Bytes of a `GET_DISPLAY_INFO` response.
pub const DISPLAY_INFO_LEN: usize = HEADER_LEN + VIRTIO_GPU_MAX_SCANOUTS as usize * 24;

/// The control header.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Header {
    /// The command (or response) type.
    pub kind: u32,
    /// `VIRTIO_GPU_FLAG_FENCE`, `VIRTIO_GPU_FLAG_INFO_RING_IDX`.
    pub flags: u32,
    /// The fence a fenced command signals.
    pub fence_id: u64,
    /// The 3D context (always 0 here).
    pub ctx_id: u32,
    /// The fence ring (with `INFO_RING_IDX`).
    pub ring_idx: u8,
}

/// A rectangle as the protocol writes it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuRect {
    /// Left edge.
    pub x: u32,
    /// Top edge.
    pub y: u32,
    /// Width.
    pub width: u32,
    /// Height.
    pub height: u32,
}

impl GpuRect {
    /// Whether it lies inside a `width` x `height` image (without overflow).
    pub fn fits(&self, width: u32, height: u32) -> bool {
        self.x.checked_add(self.width).is_some_and(|r| r <= width)
            && self.y.checked_add(self.height).is_some_and(|b| b <= height)
    }
}

/// One backing page range of a resource, in guest memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemEntry {
    /// Guest-physical address.
    pub addr: u64,
    /// Bytes.
    pub length: u32,
}

/// A request, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `GET_DISPLAY_INFO`.
    GetDisplayInfo,
    /// `RESOURCE_CREATE_2D`.
    ResourceCreate2d {
        /// The guest's id for it.
        resource_id: u32,
        /// A `VIRTIO_GPU_FORMAT_*`.
        format: u32,
        /// Pixels.
        width: u32,
        /// Pixels.
        height: u32,
    },
    /// `RESOURCE_UNREF`.
    ResourceUnref {
        /// Which.
        resource_id: u32,
    },
    /// `SET_SCANOUT`.
    SetScanout {
        /// The part of the resource shown.
        rect: GpuRect,
        /// Which scanout.
        scanout_id: u32,
        /// 0 disables the scanout.
        resource_id: u32,
    },
    /// `RESOURCE_FLUSH`: a present.
    ResourceFlush {
        /// What changed, in resource coordinates.
        rect: GpuRect,
        /// Which.
        resource_id: u32,
    },
    /// `TRANSFER_TO_HOST_2D`.
    TransferToHost2d {
        /// Where in the resource.
        rect: GpuRect,
        /// Where in the backing the rectangle's first pixel is.
        offset: u64,
        /// Which.
        resource_id: u32,
    },
    /// `RESOURCE_ATTACH_BACKING`.
    AttachBacking {
        /// Which.
        resource_id: u32,
        /// The guest pages, in order.
        entries: Vec<MemEntry>,
    },
    /// `RESOURCE_DETACH_BACKING`.
    DetachBacking {
        /// Which.
        resource_id: u32,
    },
    /// `UPDATE_CURSOR` or `MOVE_CURSOR` (the cursor queue).
    Cursor,
    /// Anything else: answered `ERR_UNSPEC`.
    Unsupported(u32),
}

/// Why a request could not be parsed; the response is the error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// Fewer bytes than the header.
    #[error("request of {0} bytes has no whole header")]
    NoHeader(usize),
    /// Fewer bytes than the command's fields.
    #[error("command {kind:#x} needs {need} bytes, got {got}")]
    Short {
        /// The command.
        kind: u32,
        /// Bytes it needs.
        need: usize,
        /// Bytes there are.
        got: usize,
    },
    /// More backing entries than [`MAX_ENTRIES`].
    #[error("{0} backing entries (at most {MAX_ENTRIES})")]
    TooManyEntries(u32),
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

fn rect_at(b: &[u8], at: usize) -> GpuRect {
    GpuRect {
        x: u32_at(b, at),
        y: u32_at(b, at + 4),
        width: u32_at(b, at + 8),
        height: u32_at(b, at + 12),
    }
}

/// Parses the header alone (so an error response can still echo it).
pub fn parse_header(b: &[u8]) -> Result<Header, ParseError> {
    if b.len() < HEADER_LEN {
        return Err(ParseError::NoHeader(b.len()));
    }
    Ok(Header {
        kind: u32_at(b, 0),
        flags: u32_at(b, 4),
        fence_id: u64_at(b, 8),
        ctx_id: u32_at(b, 16),
        ring_idx: b[20],
    })
}

/// Parses one request's readable bytes.
pub fn parse(b: &[u8]) -> Result<(Header, Command), ParseError> {
    let h = parse_header(b)?;
    let body = &b[HEADER_LEN..];
    let need = |n: usize| {
        if body.len() < n {
            Err(ParseError::Short {
                kind: h.kind,
                need: HEADER_LEN + n,
                got: b.len(),
            })
        } else {
            Ok(())
        }
    };
    let cmd = match h.kind {
        CMD_GET_DISPLAY_INFO => Command::GetDisplayInfo,
        CMD_RESOURCE_CREATE_2D => {
            need(16)?;
            Command::ResourceCreate2d {
                resource_id: u32_at(body, 0),
                format: u32_at(body, 4),
                width: u32_at(body, 8),
                height: u32_at(body, 12),
            }
        }
        CMD_RESOURCE_UNREF => {
            need(4)?;
            Command::ResourceUnref {
                resource_id: u32_at(body, 0),
            }
        }
        CMD_SET_SCANOUT => {
            need(24)?;
            Command::SetScanout {
                rect: rect_at(body, 0),
                scanout_id: u32_at(body, 16),
                resource_id: u32_at(body, 20),
            }
        }
        CMD_RESOURCE_FLUSH => {
            need(20)?;
            Command::ResourceFlush {
                rect: rect_at(body, 0),
                resource_id: u32_at(body, 16),
            }
        }
        CMD_TRANSFER_TO_HOST_2D => {
            need(28)?;
            Command::TransferToHost2d {
                rect: rect_at(body, 0),
                offset: u64_at(body, 16),
                resource_id: u32_at(body, 24),
            }
        }
        CMD_RESOURCE_ATTACH_BACKING => {
            need(8)?;
            let resource_id = u32_at(body, 0);
            let count = u32_at(body, 4);
            if count > MAX_ENTRIES {
                return Err(ParseError::TooManyEntries(count));
            }
            // At most MAX_ENTRIES * 16 bytes: no overflow.
            need(8 + count as usize * ENTRY_LEN)?;
            let entries = body[8..8 + count as usize * ENTRY_LEN]
                .chunks_exact(ENTRY_LEN)
                .map(|e| MemEntry {
                    addr: u64_at(e, 0),
                    length: u32_at(e, 8),
                })
                .collect();
            Command::AttachBacking {
                resource_id,
                entries,
            }
        }
        CMD_RESOURCE_DETACH_BACKING => {
            need(4)?;
            Command::DetachBacking {
                resource_id: u32_at(body, 0),
            }
        }
        CMD_UPDATE_CURSOR | CMD_MOVE_CURSOR => Command::Cursor,
        other => Command::Unsupported(other),
    };
    Ok((h, cmd))
}

/// What the device answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Response {
    /// `OK_NODATA`.
    NoData,
    /// `OK_DISPLAY_INFO` with one enabled scanout of this size.
    DisplayInfo {
        /// Pixels.
        width: u32,
        /// Pixels.
        height: u32,
    },
    /// `ERR_UNSPEC`.
    Unspec,
    /// `ERR_OUT_OF_MEMORY`.
    OutOfMemory,
    /// `ERR_INVALID_SCANOUT_ID`.
    InvalidScanout,
    /// `ERR_INVALID_RESOURCE_ID`.
    InvalidResource,
    /// `ERR_INVALID_PARAMETER`.
    InvalidParameter,
}

impl From<ParseError> for Response {
    fn from(e: ParseError) -> Self {
        match e {
            ParseError::NoHeader(_) => Response::Unspec,
            ParseError::Short { .. } | ParseError::TooManyEntries(_) => Response::InvalidParameter,
        }
    }
}

impl Response {
    fn kind(&self) -> u32 {
        match self {
            Response::NoData => RESP_OK_NODATA,
            Response::DisplayInfo { .. } => RESP_OK_DISPLAY_INFO,
            Response::Unspec => RESP_ERR_UNSPEC,
            Response::OutOfMemory => RESP_ERR_OUT_OF_MEMORY,
            Response::InvalidScanout => RESP_ERR_INVALID_SCANOUT_ID,
            Response::InvalidResource => RESP_ERR_INVALID_RESOURCE_ID,
            Response::InvalidParameter => RESP_ERR_INVALID_PARAMETER,
        }
    }

    /// The response's bytes, echoing the request's fence (`request`).
    pub fn encode(&self, request: &Header) -> Vec<u8> {
        let len = match self {
            Response::DisplayInfo { .. } => DISPLAY_INFO_LEN,
            _ => HEADER_LEN,
        };
        let mut out = vec![0u8; len];
        let flags = request.flags & (VIRTIO_GPU_FLAG_FENCE | VIRTIO_GPU_FLAG_INFO_RING_IDX);
        out[0..4].copy_from_slice(&self.kind().to_le_bytes());
        out[4..8].copy_from_slice(&flags.to_le_bytes());
        if flags & VIRTIO_GPU_FLAG_FENCE != 0 {
            out[8..16].copy_from_slice(&request.fence_id.to_le_bytes());
            out[16..20].copy_from_slice(&request.ctx_id.to_le_bytes());
            if flags & VIRTIO_GPU_FLAG_INFO_RING_IDX != 0 {
                out[20] = request.ring_idx;
            }
        }
        if let Response::DisplayInfo { width, height } = *self {
            // pmodes[0]: r = (0, 0, width, height), enabled = 1, flags = 0.
            let m = HEADER_LEN;
            out[m + 8..m + 12].copy_from_slice(&width.to_le_bytes());
            out[m + 12..m + 16].copy_from_slice(&height.to_le_bytes());
            out[m + 16..m + 20].copy_from_slice(&1u32.to_le_bytes());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(kind: u32, body: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&kind.to_le_bytes());
        b.extend_from_slice(body);
        b
    }

    fn words(ws: &[u32]) -> Vec<u8> {
        ws.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    #[test]
    fn each_2d_command_parses_its_fields() {
        let (_, c) = parse(&request(CMD_RESOURCE_CREATE_2D, &words(&[7, 2, 640, 480]))).unwrap();
        assert_eq!(
            c,
            Command::ResourceCreate2d {
                resource_id: 7,
                format: 2,
                width: 640,
                height: 480
            }
        );
        let mut t = words(&[1, 2, 3, 4]);
        t.extend_from_slice(&99u64.to_le_bytes());
        t.extend_from_slice(&words(&[7, 0]));
        let (_, c) = parse(&request(CMD_TRANSFER_TO_HOST_2D, &t)).unwrap();
        assert_eq!(
            c,
            Command::TransferToHost2d {
                rect: GpuRect {
                    x: 1,
                    y: 2,
                    width: 3,
                    height: 4
                },
                offset: 99,
                resource_id: 7
            }
        );
        let mut a = words(&[7, 2]);
        for (addr, len) in [(0x1000u64, 4096u32), (0x8000, 100)] {
            a.extend_from_slice(&addr.to_le_bytes());
            a.extend_from_slice(&words(&[len, 0]));
        }
        let (_, c) = parse(&request(CMD_RESOURCE_ATTACH_BACKING, &a)).unwrap();
        assert_eq!(
            c,
            Command::AttachBacking {
                resource_id: 7,
                entries: vec![
                    MemEntry {
                        addr: 0x1000,
                        length: 4096
                    },
                    MemEntry {
                        addr: 0x8000,
                        length: 100
                    }
                ]
            }
        );
    }

    #[test]
    fn short_requests_and_entry_counts_past_the_bytes_or_the_cap_are_refused_before_allocating() {
        assert_eq!(parse(&[0; 10]), Err(ParseError::NoHeader(10)));
        assert!(matches!(
            parse(&request(CMD_SET_SCANOUT, &[0; 23])),
            Err(ParseError::Short {
                need: 48,
                got: 47,
                ..
            })
        ));
        assert!(matches!(
            parse(&request(CMD_RESOURCE_ATTACH_BACKING, &words(&[1, 3]))),
            Err(ParseError::Short { .. })
        ));
        assert_eq!(
            parse(&request(
                CMD_RESOURCE_ATTACH_BACKING,
                &words(&[1, u32::MAX])
            )),
            Err(ParseError::TooManyEntries(u32::MAX))
        );
        assert_eq!(
            parse(&request(0x1234, &[])).unwrap().1,
            Command::Unsupported(0x1234)
        );
    }

    #[test]
    fn a_fenced_request_gets_its_fence_back_and_display_info_names_one_enabled_scanout() {
        let h = Header {
            kind: CMD_GET_DISPLAY_INFO,
            flags: VIRTIO_GPU_FLAG_FENCE | 0x80,
            fence_id: 0xdead_beef,
            ctx_id: 3,
            ring_idx: 9,
        };
        let out = Response::DisplayInfo {
            width: 1024,
            height: 768,
        }
        .encode(&h);
        assert_eq!(out.len(), DISPLAY_INFO_LEN);
        assert_eq!(u32_at(&out, 0), RESP_OK_DISPLAY_INFO);
        assert_eq!(u32_at(&out, 4), VIRTIO_GPU_FLAG_FENCE);
        assert_eq!(u64_at(&out, 8), 0xdead_beef);
        assert_eq!(out[20], 0, "no ring index without INFO_RING_IDX");
        assert_eq!(
            (u32_at(&out, 32), u32_at(&out, 36), u32_at(&out, 40)),
            (1024, 768, 1)
        );
        assert_eq!(u32_at(&out, 48 + 16), 0, "scanout 1 disabled");
        let err = Response::InvalidResource.encode(&Header::default());
        assert_eq!(
            (err.len(), u32_at(&err, 0)),
            (24, RESP_ERR_INVALID_RESOURCE_ID)
        );
    }

    #[test]
    fn rectangles_that_overflow_do_not_fit() {
        let r = GpuRect {
            x: u32::MAX,
            y: 0,
            width: 2,
            height: 1,
        };
        assert!(!r.fits(u32::MAX, 10));
        assert!(GpuRect {
            x: 0,
            y: 0,
            width: 10,
            height: 10
        }
        .fits(10, 10));
    }
}
