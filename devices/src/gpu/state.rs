//! The 2D engine behind virtio-gpu: resources (host copies of guest
//! images), their backing pages in guest memory, the one scanout, and
//! presents into the sandbox's [`Screen`].
//!
//! It owns every bound a guest could push: at most [`MAX_RESOURCES`]
//! resources and [`MAX_RESOURCE_BYTES`] of host memory for them (past
//! that: `ERR_OUT_OF_MEMORY`), sides within [`MAX_SIDE`], backing entries
//! inside guest memory when attached, and every transfer's rectangle,
//! offset and rows inside both the resource and its backing. A command
//! that breaks one gets the spec's error response and changes nothing; no
//! input can make it panic or read or write outside guest memory or a
//! resource.

use std::collections::HashMap;
use std::sync::Arc;

use boxdesk_platform::screen::{Rect, Screen, MAX_SIDE};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemory};

use super::protocol::{Command, GpuRect, MemEntry, Response};
use crate::virtio::Memory;

/// Most resources at once.
pub const MAX_RESOURCES: usize = 1024;
/// Most host memory for resources, in all.
pub const MAX_RESOURCE_BYTES: usize = 256 << 20;
const BPP: usize = 4;

/// How a format's bytes map onto ours (B, G, R, X in memory): for each of
/// our four bytes, which byte of the guest's pixel it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Swizzle([u8; 4]);

const SAME: Swizzle = Swizzle([0, 1, 2, 3]);

/// The `VIRTIO_GPU_FORMAT_*` values a 2D resource may have, and how each
/// becomes `XRGB8888`.
fn swizzle(format: u32) -> Option<Swizzle> {
    Some(match format {
        // B8G8R8A8, B8G8R8X8: already ours.
        1 | 2 => SAME,
        // A8R8G8B8, X8R8G8B8: bytes A R G B.
        3 | 4 => Swizzle([3, 2, 1, 0]),
        // R8G8B8A8, R8G8B8X8: bytes R G B A.
        67 | 134 => Swizzle([2, 1, 0, 3]),
        // X8B8G8R8, A8B8G8R8: bytes X B G R.
        68 | 121 => Swizzle([1, 2, 3, 0]),
        _ => return None,
    })
}

/// One resource: its pixels on the host, and where the guest keeps them.
struct Resource {
    width: u32,
    height: u32,
    swizzle: Swizzle,
    /// `width * 4` bytes per row, `height` rows, already `XRGB8888`.
    pixels: Vec<u8>,
    /// The guest pages, in order, and where each starts in the backing.
    backing: Vec<(GuestAddress, u32, u64)>,
    backing_len: u64,
}

impl Resource {
    fn stride(&self) -> usize {
        self.width as usize * BPP
    }

    /// Reads `dst.len()` bytes of the backing from `offset` on; false
    /// when that runs past the backing or a page is not guest memory.
    fn read_backing(&self, mem: &Memory, offset: u64, dst: &mut [u8]) -> bool {
        let Some(end) = offset.checked_add(dst.len() as u64) else {
            return false;
        };
        if end > self.backing_len {
            return false;
        }
        // The entry holding `offset`: the last one starting at or before it.
        let mut i = self.backing.partition_point(|e| e.2 <= offset) - 1;
        let mut at = offset;
        let mut done = 0;
        while done < dst.len() {
            let Some(&(addr, len, start)) = self.backing.get(i) else {
                return false;
            };
            let within = at - start;
            let n = (u64::from(len) - within).min((dst.len() - done) as u64) as usize;
            let Some(from) = addr.checked_add(within) else {
                return false;
            };
            if mem.read_slice(&mut dst[done..done + n], from).is_err() {
                return false;
            }
            done += n;
            at += n as u64;
            i += 1;
        }
        true
    }
}

/// What the scanout shows: a resource's rectangle.
#[derive(Debug, Clone, Copy)]
struct Scanout {
    resource_id: u32,
    rect: GpuRect,
}

/// The device's 2D state.
pub struct Gpu2d {
    screen: Arc<Screen>,
    resources: HashMap<u32, Resource>,
    bytes: usize,
    scanout: Option<Scanout>,
}

impl Gpu2d {
    /// No resources, scanout off, presenting into `screen`.
    pub fn new(screen: Arc<Screen>) -> Self {
        Self {
            screen,
            resources: HashMap::new(),
            bytes: 0,
            scanout: None,
        }
    }

    /// Forgets every resource (a device reset).
    pub fn reset(&mut self) {
        self.resources.clear();
        self.bytes = 0;
        self.scanout = None;
    }

    /// Runs one command against guest memory `mem`.
    pub fn execute(&mut self, mem: &Memory, cmd: Command) -> Response {
        match cmd {
            Command::GetDisplayInfo => {
                let (width, height) = self.screen.max_size();
                Response::DisplayInfo { width, height }
            }
            Command::ResourceCreate2d {
                resource_id,
                format,
                width,
                height,
            } => self.create(resource_id, format, width, height),
            Command::ResourceUnref { resource_id } => {
                let Some(r) = self.resources.remove(&resource_id) else {
                    return Response::InvalidResource;
                };
                self.bytes -= r.pixels.len();
                if self.scanout.is_some_and(|s| s.resource_id == resource_id) {
                    self.scanout = None;
                }
                Response::NoData
            }
            Command::SetScanout {
                rect,
                scanout_id,
                resource_id,
            } => self.set_scanout(rect, scanout_id, resource_id),
            Command::ResourceFlush { rect, resource_id } => self.flush(rect, resource_id),
            Command::TransferToHost2d {
                rect,
                offset,
                resource_id,
            } => self.transfer(mem, rect, offset, resource_id),
            Command::AttachBacking {
                resource_id,
                entries,
            } => self.attach(mem, resource_id, &entries),
            Command::DetachBacking { resource_id } => match self.resources.get_mut(&resource_id) {
                Some(r) => {
                    r.backing.clear();
                    r.backing_len = 0;
                    Response::NoData
                }
                None => Response::InvalidResource,
            },
            Command::Cursor => Response::NoData,
            Command::Unsupported(_) => Response::Unspec,
        }
    }

    fn create(&mut self, id: u32, format: u32, width: u32, height: u32) -> Response {
        if id == 0 || self.resources.contains_key(&id) {
            return Response::InvalidResource;
        }
        let Some(swizzle) = swizzle(format) else {
            return Response::InvalidParameter;
        };
        if width == 0 || height == 0 || width > MAX_SIDE || height > MAX_SIDE {
            return Response::InvalidParameter;
        }
        // At most 8192 * 8192 * 4 = 256 MiB: no overflow.
        let size = width as usize * height as usize * BPP;
        if self.resources.len() >= MAX_RESOURCES || self.bytes + size > MAX_RESOURCE_BYTES {
            return Response::OutOfMemory;
        }
        let mut pixels = Vec::new();
        if pixels.try_reserve_exact(size).is_err() {
            return Response::OutOfMemory;
        }
        pixels.resize(size, 0);
        self.bytes += size;
        self.resources.insert(
            id,
            Resource {
                width,
                height,
                swizzle,
                pixels,
                backing: Vec::new(),
                backing_len: 0,
            },
        );
        Response::NoData
    }

    fn attach(&mut self, mem: &Memory, id: u32, entries: &[MemEntry]) -> Response {
        let Some(r) = self.resources.get_mut(&id) else {
            return Response::InvalidResource;
        };
        let mut backing = Vec::with_capacity(entries.len());
        let mut len = 0u64;
        for e in entries {
            let addr = GuestAddress(e.addr);
            if e.length == 0 || !mem.check_range(addr, e.length as usize) {
                return Response::InvalidParameter;
            }
            backing.push((addr, e.length, len));
            len += u64::from(e.length);
        }
        r.backing = backing;
        r.backing_len = len;
        Response::NoData
    }

    fn set_scanout(&mut self, rect: GpuRect, scanout_id: u32, id: u32) -> Response {
        if scanout_id != 0 {
            return Response::InvalidScanout;
        }
        if id == 0 {
            self.scanout = None;
            return Response::NoData;
        }
        let Some(r) = self.resources.get(&id) else {
            return Response::InvalidResource;
        };
        if rect.width == 0 || rect.height == 0 || !rect.fits(r.width, r.height) {
            return Response::InvalidParameter;
        }
        self.scanout = Some(Scanout {
            resource_id: id,
            rect,
        });
        Response::NoData
    }

    fn transfer(&mut self, mem: &Memory, rect: GpuRect, offset: u64, id: u32) -> Response {
        let Some(r) = self.resources.get_mut(&id) else {
            return Response::InvalidResource;
        };
        if !rect.fits(r.width, r.height) {
            return Response::InvalidParameter;
        }
        let stride = r.stride();
        let row = rect.width as usize * BPP;
        // Row k of the rectangle is at `offset + k * stride` in the backing.
        let last = u64::from(rect.height.saturating_sub(1)) * stride as u64;
        let fits = offset
            .checked_add(last)
            .and_then(|o| o.checked_add(row as u64))
            .is_some_and(|end| end <= r.backing_len);
        if rect.height > 0 && row > 0 && !fits {
            return Response::InvalidParameter;
        }
        let mut pixels = std::mem::take(&mut r.pixels);
        let mut ok = true;
        for k in 0..rect.height as usize {
            let at = (rect.y as usize + k) * stride + rect.x as usize * BPP;
            let dst = &mut pixels[at..at + row];
            if !r.read_backing(mem, offset + (k * stride) as u64, dst) {
                ok = false;
                break;
            }
            if r.swizzle != SAME {
                let s = r.swizzle.0;
                for px in dst.chunks_exact_mut(BPP) {
                    let p = [px[0], px[1], px[2], px[3]];
                    for (i, &from) in s.iter().enumerate() {
                        px[i] = p[from as usize];
                    }
                }
            }
        }
        r.pixels = pixels;
        if ok {
            Response::NoData
        } else {
            Response::Unspec
        }
    }

    fn flush(&mut self, rect: GpuRect, id: u32) -> Response {
        let Some(r) = self.resources.get(&id) else {
            return Response::InvalidResource;
        };
        if !rect.fits(r.width, r.height) {
            return Response::InvalidParameter;
        }
        let Some(s) = self.scanout.filter(|s| s.resource_id == id) else {
            // Not on screen: nothing to present.
            return Response::NoData;
        };
        // The flushed rectangle, in scanout coordinates.
        let sr = s.rect;
        let x0 = rect.x.max(sr.x);
        let y0 = rect.y.max(sr.y);
        let x1 = (rect.x + rect.width).min(sr.x + sr.width);
        let y1 = (rect.y + rect.height).min(sr.y + sr.height);
        if x0 >= x1 || y0 >= y1 {
            return Response::NoData;
        }
        let damage = Rect {
            x: x0 - sr.x,
            y: y0 - sr.y,
            w: x1 - x0,
            h: y1 - y0,
        };
        let stride = r.stride();
        let start = sr.y as usize * stride + sr.x as usize * BPP;
        self.screen
            .present(&r.pixels[start..], stride, sr.width, sr.height, damage);
        Response::NoData
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem() -> Memory {
        Memory::from_ranges(&[(GuestAddress(0), 4 << 20)]).unwrap()
    }

    fn gpu(w: u32, h: u32) -> (Gpu2d, Arc<Screen>) {
        let screen = Arc::new(Screen::new(w, h).unwrap());
        (Gpu2d::new(screen.clone()), screen)
    }

    fn slot(screen: &Screen, slot: u32) -> Vec<u8> {
        let mut all = Vec::new();
        std::io::Read::read_to_end(
            &mut std::fs::File::from(screen.reader_fd().unwrap()),
            &mut all,
        )
        .unwrap();
        let n = screen.layout().slot_size as usize;
        all[slot as usize * n..][..n].to_vec()
    }

    fn rect(x: u32, y: u32, width: u32, height: u32) -> GpuRect {
        GpuRect {
            x,
            y,
            width,
            height,
        }
    }

    /// Creates resource 1 (w x h, `format`) backed by scattered 4 KiB pages
    /// at 1 MiB, every other page, and shows it.
    fn setup(g: &mut Gpu2d, m: &Memory, w: u32, h: u32, format: u32) -> Vec<GuestAddress> {
        let create = Command::ResourceCreate2d {
            resource_id: 1,
            format,
            width: w,
            height: h,
        };
        assert_eq!(g.execute(m, create), Response::NoData);
        let pages = (w as usize * h as usize * 4).div_ceil(4096);
        let addrs: Vec<GuestAddress> = (0..pages)
            .map(|i| GuestAddress(0x10_0000 + i as u64 * 8192))
            .collect();
        let entries = addrs
            .iter()
            .map(|a| MemEntry {
                addr: a.0,
                length: 4096,
            })
            .collect();
        let attach = Command::AttachBacking {
            resource_id: 1,
            entries,
        };
        assert_eq!(g.execute(m, attach), Response::NoData);
        let set = Command::SetScanout {
            rect: rect(0, 0, w, h),
            scanout_id: 0,
            resource_id: 1,
        };
        assert_eq!(g.execute(m, set), Response::NoData);
        addrs
    }

    /// Writes `image` (packed rows) into the scattered backing.
    fn write_backing(m: &Memory, pages: &[GuestAddress], image: &[u8]) {
        for (i, chunk) in image.chunks(4096).enumerate() {
            m.write_slice(chunk, pages[i]).unwrap();
        }
    }

    #[test]
    fn a_transfer_and_flush_present_the_guest_image_across_scattered_pages() {
        let m = mem();
        let (mut g, screen) = gpu(40, 30);
        let pages = setup(&mut g, &m, 40, 30, 2);
        let image: Vec<u8> = (0..40 * 30 * 4).map(|i| (i % 253) as u8).collect();
        write_backing(&m, &pages, &image);
        let lease = screen.lease();
        let t = Command::TransferToHost2d {
            rect: rect(0, 0, 40, 30),
            offset: 0,
            resource_id: 1,
        };
        assert_eq!(g.execute(&m, t), Response::NoData);
        let f = Command::ResourceFlush {
            rect: rect(0, 0, 40, 30),
            resource_id: 1,
        };
        assert_eq!(g.execute(&m, f), Response::NoData);
        let rec = lease.next(std::time::Duration::ZERO).unwrap();
        assert_eq!(rec.to_string(), "present 1 1 0 0 40 30");
        assert_eq!(slot(&screen, 1), image);
    }

    #[test]
    fn a_partial_transfer_copies_only_its_rectangle_from_its_offset() {
        let m = mem();
        let (mut g, screen) = gpu(16, 16);
        let pages = setup(&mut g, &m, 16, 16, 2);
        write_backing(&m, &pages, &[9u8; 16 * 16 * 4]);
        let t = Command::TransferToHost2d {
            rect: rect(2, 3, 4, 5),
            offset: (3 * 16 + 2) * 4,
            resource_id: 1,
        };
        assert_eq!(g.execute(&m, t), Response::NoData);
        g.execute(
            &m,
            Command::ResourceFlush {
                rect: rect(0, 0, 16, 16),
                resource_id: 1,
            },
        );
        let s = slot(&screen, 1);
        for y in 0..16 {
            for x in 0..16 {
                let inside = (2..6).contains(&x) && (3..8).contains(&y);
                assert_eq!(s[(y * 16 + x) * 4], if inside { 9 } else { 0 }, "{x},{y}");
            }
        }
    }

    #[test]
    fn rgbx_resources_are_converted_to_xrgb8888() {
        let m = mem();
        let (mut g, screen) = gpu(16, 16);
        let pages = setup(&mut g, &m, 16, 16, 134);
        let image: Vec<u8> = [0x11, 0x22, 0x33, 0].repeat(256);
        write_backing(&m, &pages, &image);
        let t = Command::TransferToHost2d {
            rect: rect(0, 0, 16, 16),
            offset: 0,
            resource_id: 1,
        };
        g.execute(&m, t);
        g.execute(
            &m,
            Command::ResourceFlush {
                rect: rect(0, 0, 16, 16),
                resource_id: 1,
            },
        );
        assert_eq!(&slot(&screen, 1)[..4], &[0x33, 0x22, 0x11, 0]);
    }

    #[test]
    fn hostile_commands_get_error_responses_and_change_nothing() {
        let m = mem();
        let (mut g, _screen) = gpu(16, 16);
        let create = |id, format, w, h| Command::ResourceCreate2d {
            resource_id: id,
            format,
            width: w,
            height: h,
        };
        assert_eq!(g.execute(&m, create(0, 2, 4, 4)), Response::InvalidResource);
        assert_eq!(
            g.execute(&m, create(1, 999, 4, 4)),
            Response::InvalidParameter
        );
        assert_eq!(
            g.execute(&m, create(1, 2, 0, 4)),
            Response::InvalidParameter
        );
        assert_eq!(
            g.execute(&m, create(1, 2, 9000, 4)),
            Response::InvalidParameter
        );
        assert_eq!(g.execute(&m, create(1, 2, 8192, 8192)), Response::NoData);
        assert_eq!(g.execute(&m, create(2, 2, 16, 16)), Response::OutOfMemory);
        assert_eq!(g.execute(&m, create(1, 2, 4, 4)), Response::InvalidResource);
        g.execute(&m, Command::ResourceUnref { resource_id: 1 });
        assert_eq!(g.execute(&m, create(2, 2, 16, 16)), Response::NoData);
        // Backing outside guest memory, or wrapping the address space.
        for (addr, length) in [(4 << 20, 4096), (u64::MAX - 10, 4096), (0, 0)] {
            let a = Command::AttachBacking {
                resource_id: 2,
                entries: vec![MemEntry { addr, length }],
            };
            assert_eq!(g.execute(&m, a), Response::InvalidParameter);
        }
        let a = Command::AttachBacking {
            resource_id: 2,
            entries: vec![MemEntry {
                addr: 0,
                length: 1000,
            }],
        };
        assert_eq!(g.execute(&m, a), Response::NoData);
        // Rectangles past the resource, offsets past the backing.
        for (r, offset) in [
            (rect(0, 0, 17, 1), 0),
            (rect(u32::MAX, 0, 2, 1), 0),
            (rect(0, 0, 16, 16), 0),
            (rect(0, 0, 4, 1), u64::MAX - 3),
            (rect(0, 0, 4, 1), 1000 - 15),
        ] {
            let t = Command::TransferToHost2d {
                rect: r,
                offset,
                resource_id: 2,
            };
            assert_eq!(
                g.execute(&m, t),
                Response::InvalidParameter,
                "{r:?} {offset}"
            );
        }
        let s = |rect, scanout_id, resource_id| Command::SetScanout {
            rect,
            scanout_id,
            resource_id,
        };
        assert_eq!(
            g.execute(&m, s(rect(0, 0, 4, 4), 1, 2)),
            Response::InvalidScanout
        );
        assert_eq!(
            g.execute(&m, s(rect(0, 0, 4, 4), 0, 7)),
            Response::InvalidResource
        );
        assert_eq!(
            g.execute(&m, s(rect(8, 8, 9, 1), 0, 2)),
            Response::InvalidParameter
        );
        let f = Command::ResourceFlush {
            rect: rect(0, 0, 99, 1),
            resource_id: 2,
        };
        assert_eq!(g.execute(&m, f), Response::InvalidParameter);
        assert_eq!(g.execute(&m, Command::Unsupported(7)), Response::Unspec);
    }

    #[test]
    fn a_flush_of_the_shown_part_only_presents_that_part_in_scanout_coordinates() {
        let m = mem();
        let (mut g, screen) = gpu(16, 16);
        let create = Command::ResourceCreate2d {
            resource_id: 5,
            format: 2,
            width: 32,
            height: 32,
        };
        g.execute(&m, create);
        let set = Command::SetScanout {
            rect: rect(8, 8, 16, 16),
            scanout_id: 0,
            resource_id: 5,
        };
        assert_eq!(g.execute(&m, set), Response::NoData);
        let lease = screen.lease();
        let f = Command::ResourceFlush {
            rect: rect(0, 0, 10, 10),
            resource_id: 5,
        };
        g.execute(&m, f);
        assert_eq!(
            lease.next(std::time::Duration::ZERO).unwrap().to_string(),
            "present 1 1 0 0 2 2"
        );
    }
}
