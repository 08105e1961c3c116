//! x86_64 guests for the suite: the three CPU modes, a fixed test layout,
//! and a tiny assembler whose every method names the instruction it emits.
//!
//! Test layout (test policy only): RAM 0..128 KiB; identity page tables at
//! 0x1000 (PML4), 0x2000 (PDPT), 0x3000..0x7000 (four PDs, 2 MiB pages,
//! 0..4 GiB); code at 0x8000; a data word at 0xa000; MMIO at 0xd000_0000
//! (real mode: 0xd_0000).

use boxdesk_hv::arch::x86_64::{
    Segment, CR0_PE, CR0_PG, CR4_PAE, EFER_LMA, EFER_LME, RFLAGS_RESERVED,
};
use boxdesk_hv::{Hypervisor, MapFlags, Vcpu, VmConfig};
use vm_memory::{Bytes, GuestRegionMmap, MemoryRegionAddress};

use crate::support::Guest;

/// Default RAM size (region 0 at guest address 0).
pub const RAM: usize = 0x2_0000;
/// Where payloads are loaded and start.
pub const CODE: u64 = 0x8000;
/// A free data word, reachable in every mode (below 64 KiB).
pub const DATA: u64 = 0xa000;
/// An unmapped address for MMIO in protected and long mode.
pub const MMIO: u64 = 0xd000_0000;
/// Real mode reaches MMIO at DS = [`MMIO_REAL_SEG`], offset 0.
pub const MMIO_REAL_SEG: u16 = 0xd000;

/// The three modes every x86 payload can run in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// 16-bit real mode, segments at base 0 (DS may be moved).
    Real,
    /// 32-bit protected mode, flat segments, no paging.
    Protected,
    /// 64-bit long mode, identity-mapped 0..4 GiB.
    Long,
}

pub const MODES: [Mode; 3] = [Mode::Real, Mode::Protected, Mode::Long];

impl Mode {
    /// The guest-physical address the MMIO hole's `offset` has in this mode.
    pub fn mmio(self, offset: u64) -> u64 {
        match self {
            Mode::Real => (u64::from(MMIO_REAL_SEG) << 4) + offset,
            _ => MMIO + offset,
        }
    }
}

/// A guest with RAM at 0 (plus `extra` regions), `code` at [`CODE`], and the
/// vCPU set up for `mode`.
pub fn guest<H: Hypervisor>(
    hv: &H,
    mode: Mode,
    code: &[u8],
    extra: &[(u64, usize, MapFlags)],
) -> Guest<H> {
    guest_with(hv, &VmConfig::default(), mode, code, extra)
}

/// As [`guest`], with a VM configuration.
pub fn guest_with<H: Hypervisor>(
    hv: &H,
    config: &VmConfig,
    mode: Mode,
    code: &[u8],
    extra: &[(u64, usize, MapFlags)],
) -> Guest<H> {
    let mut regions = vec![(0, RAM, MapFlags::default())];
    regions.extend_from_slice(extra);
    let mut g = Guest::new(hv, config, &regions);
    let ram = &g.regions[0].0;
    write_page_tables(ram);
    ram.write_slice(code, MemoryRegionAddress(CODE)).unwrap();
    let mut regs = g.vcpu.get_regs().unwrap();
    let s = &mut regs.sregs;
    match mode {
        Mode::Real => {
            s.cs = Segment::real_mode(0, true);
            s.ds = Segment::real_mode(0, false);
            s.cr0 &= !(CR0_PE | CR0_PG);
        }
        Mode::Protected => {
            s.cs = Segment::flat32(0x8, true);
            s.ds = Segment::flat32(0x10, false);
            s.cr0 = (s.cr0 | CR0_PE) & !CR0_PG;
        }
        Mode::Long => {
            s.cs = Segment::flat64(0x8, true);
            s.ds = Segment::flat64(0x10, false);
            s.cr3 = 0x1000;
            s.cr4 |= CR4_PAE;
            s.cr0 |= CR0_PE | CR0_PG;
            s.efer |= EFER_LME | EFER_LMA;
        }
    }
    (s.es, s.fs, s.gs, s.ss) = (s.ds, s.ds, s.ds, s.ds);
    regs.gp = Default::default();
    regs.gp.rip = CODE;
    regs.gp.rflags = RFLAGS_RESERVED;
    g.vcpu.set_regs(&regs).unwrap();
    g
}

fn write_page_tables(ram: &GuestRegionMmap) {
    let at = MemoryRegionAddress;
    ram.write_obj(0x2000u64 | 3, at(0x1000)).unwrap();
    for pd in 0..4u64 {
        ram.write_obj((0x3000 + pd * 0x1000) | 3, at(0x2000 + pd * 8))
            .unwrap();
        for i in 0..512u64 {
            let phys = (pd << 30) | (i << 21);
            ram.write_obj(phys | 0x83, at(0x3000 + pd * 0x1000 + i * 8))
                .unwrap();
        }
    }
}

/// Emits instructions for one mode. Operand sizes: 1, 2, 4 (and 8 in long
/// mode); the 0x66 prefix flips between 16 and 32 bits as the mode demands.
pub struct Asm {
    mode: Mode,
    pub bytes: Vec<u8>,
}

impl Asm {
    pub fn new(mode: Mode) -> Self {
        Self {
            mode,
            bytes: Vec::new(),
        }
    }

    fn emit(&mut self, b: &[u8]) -> &mut Self {
        self.bytes.extend_from_slice(b);
        self
    }

    /// Operand-size prefix for a `size`-byte operation (2 or 4), if needed.
    fn osize(&mut self, size: usize) -> &mut Self {
        match (self.mode, size) {
            (Mode::Real, 4) | (Mode::Protected | Mode::Long, 2) => self.emit(&[0x66]),
            _ => self,
        }
    }

    /// `mov dx, port`
    pub fn mov_dx(&mut self, port: u16) -> &mut Self {
        self.osize(2).emit(&[0xba]).emit(&port.to_le_bytes())
    }

    /// `in al|ax|eax, dx`
    pub fn in_dx(&mut self, size: usize) -> &mut Self {
        match size {
            1 => self.emit(&[0xec]),
            _ => self.osize(size).emit(&[0xed]),
        }
    }

    /// `out dx, al|ax|eax`
    pub fn out_dx(&mut self, size: usize) -> &mut Self {
        match size {
            1 => self.emit(&[0xee]),
            _ => self.osize(size).emit(&[0xef]),
        }
    }

    /// `add al|ax|eax, imm`
    pub fn add_acc(&mut self, size: usize, imm: u32) -> &mut Self {
        match size {
            1 => self.emit(&[0x04, imm as u8]),
            2 => self
                .osize(2)
                .emit(&[0x05])
                .emit(&(imm as u16).to_le_bytes()),
            _ => self.osize(4).emit(&[0x05]).emit(&imm.to_le_bytes()),
        }
    }

    /// `mov al|ax|eax|rax, imm`
    pub fn mov_acc(&mut self, size: usize, imm: u64) -> &mut Self {
        match size {
            1 => self.emit(&[0xb0, imm as u8]),
            2 => self
                .osize(2)
                .emit(&[0xb8])
                .emit(&(imm as u16).to_le_bytes()),
            4 => self
                .osize(4)
                .emit(&[0xb8])
                .emit(&(imm as u32).to_le_bytes()),
            _ => self.emit(&[0x48, 0xb8]).emit(&imm.to_le_bytes()),
        }
    }

    /// `mov bx|ebx|rbx, addr` — the address register of [`Self::store`] and
    /// [`Self::load`] (real mode: an offset into DS).
    pub fn mov_addr(&mut self, addr: u64) -> &mut Self {
        match self.mode {
            Mode::Real => self.emit(&[0xbb]).emit(&(addr as u16).to_le_bytes()),
            Mode::Protected => self.emit(&[0xbb]).emit(&(addr as u32).to_le_bytes()),
            Mode::Long => self.emit(&[0x48, 0xbb]).emit(&addr.to_le_bytes()),
        }
    }

    /// ModRM for `[bx]` (16-bit addressing) or `[ebx]`/`[rbx]`.
    fn m_bx(&self) -> u8 {
        if self.mode == Mode::Real {
            0x07
        } else {
            0x03
        }
    }

    /// `mov [bx], al|ax|eax|rax`
    pub fn store(&mut self, size: usize) -> &mut Self {
        let m = self.m_bx();
        match size {
            1 => self.emit(&[0x88, m]),
            8 => self.emit(&[0x48, 0x89, m]),
            _ => self.osize(size).emit(&[0x89, m]),
        }
    }

    /// `mov al|ax|eax|rax, [bx]`
    pub fn load(&mut self, size: usize) -> &mut Self {
        let m = self.m_bx();
        match size {
            1 => self.emit(&[0x8a, m]),
            8 => self.emit(&[0x48, 0x8b, m]),
            _ => self.osize(size).emit(&[0x8b, m]),
        }
    }

    /// `shr rax, 32` (long mode only)
    pub fn shr_rax_32(&mut self) -> &mut Self {
        self.emit(&[0x48, 0xc1, 0xe8, 0x20])
    }

    /// `mov ecx|cx, imm` then `1: dec; jnz 1b` — a countdown loop.
    pub fn spin(&mut self, iterations: u16) -> &mut Self {
        self.emit(&[0xb9]).emit(&iterations.to_le_bytes());
        if self.mode != Mode::Real {
            self.emit(&[0, 0]);
        }
        self.emit(&[0xff, 0xc9, 0x75, 0xfc])
    }

    /// `mov ax, sel` then `mov ds, ax` (real mode only).
    pub fn mov_ds(&mut self, sel: u16) -> &mut Self {
        assert_eq!(self.mode, Mode::Real);
        self.emit(&[0xb8])
            .emit(&sel.to_le_bytes())
            .emit(&[0x8e, 0xd8])
    }

    /// Points the address register at the MMIO hole (real mode: DS moves).
    pub fn mov_mmio_addr(&mut self, offset: u64) -> &mut Self {
        if self.mode == Mode::Real {
            self.mov_ds(MMIO_REAL_SEG).mov_addr(offset)
        } else {
            self.mov_addr(MMIO + offset)
        }
    }

    /// `hlt`
    pub fn hlt(&mut self) -> &mut Self {
        self.emit(&[0xf4])
    }

    /// `int3`
    pub fn int3(&mut self) -> &mut Self {
        self.emit(&[0xcc])
    }

    /// `1: jmp 1b`
    pub fn jmp_self(&mut self) -> &mut Self {
        self.emit(&[0xeb, 0xfe])
    }
}
