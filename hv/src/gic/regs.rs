//! GICv3 distributor and redistributor registers (guest MMIO).

use super::{GicV3, Irq, PRIORITY_MASK};

/// GICD_CTLR.EnableGrp0.
const CTLR_ENABLE_GRP0: u32 = 1;
/// GICD_CTLR.EnableGrp1.
pub(super) const CTLR_ENABLE_GRP1: u32 = 1 << 1;
/// GICD_CTLR.ARE (affinity routing, always on).
const CTLR_ARE: u32 = 1 << 4;
/// GICD_CTLR.DS (one security state, always on).
const CTLR_DS: u32 = 1 << 6;
/// PIDR2 with ArchRev = 3 (GICv3).
const PIDR2: u64 = 0x3b;
/// IIDR: implementer Arm (0x43b).
const IIDR: u64 = 0x43b;

/// Size of the SGI_base frame offset inside one redistributor.
const SGI_FRAME: u64 = 0x1_0000;
/// One vCPU's redistributor: RD_base + SGI_base.
const REDIST_STRIDE: u64 = 0x2_0000;

/// The per-interrupt register banks shared by GICD and GICR's SGI frame.
enum Bank {
    Group,
    SetEnable,
    ClearEnable,
    SetPending,
    ClearPending,
    SetActive,
    ClearActive,
    Priority,
    Config,
}

impl Bank {
    /// The bank at `offset` and the first INTID it covers.
    fn at(offset: u64) -> Option<(Self, u32)> {
        let bits = |base: u64| ((offset - base) / 4 * 32) as u32;
        Some(match offset {
            0x080..0x100 => (Self::Group, bits(0x080)),
            0x100..0x180 => (Self::SetEnable, bits(0x100)),
            0x180..0x200 => (Self::ClearEnable, bits(0x180)),
            0x200..0x280 => (Self::SetPending, bits(0x200)),
            0x280..0x300 => (Self::ClearPending, bits(0x280)),
            0x300..0x380 => (Self::SetActive, bits(0x300)),
            0x380..0x400 => (Self::ClearActive, bits(0x380)),
            0x400..0x800 => (Self::Priority, (offset - 0x400) as u32),
            0xc00..0xd00 => (Self::Config, ((offset - 0xc00) * 4) as u32),
            _ => return None,
        })
    }

    /// Reads `len` bytes of this bank starting at INTID `first`, from
    /// `irqs` holding INTIDs `base..`.
    fn read(&self, irqs: &[Irq], base: u32, first: u32, len: usize) -> u64 {
        let irq = |id: u32| id.checked_sub(base).and_then(|i| irqs.get(i as usize));
        let mut value = 0u64;
        match self {
            Self::Priority => {
                for i in 0..len as u32 {
                    let p = irq(first + i).map_or(0, |irq| irq.priority);
                    value |= u64::from(p) << (8 * i);
                }
            }
            Self::Config => {
                for i in 0..(len as u32 * 4) {
                    if irq(first + i).is_some_and(|irq| irq.edge) {
                        value |= 2 << (2 * i);
                    }
                }
            }
            _ => {
                for i in 0..(len as u32 * 8) {
                    let set = irq(first + i).is_some_and(|irq| match self {
                        Self::Group => irq.group1,
                        Self::SetEnable | Self::ClearEnable => irq.enabled,
                        Self::SetPending | Self::ClearPending => irq.pending(),
                        _ => irq.active,
                    });
                    value |= u64::from(set) << i;
                }
            }
        }
        value
    }

    /// Writes `len` bytes of `value` to this bank starting at INTID `first`,
    /// into `irqs` holding INTIDs `base..`. SGIs (INTIDs 0..16) ignore
    /// configuration writes: they are always edge-triggered.
    fn write(&self, irqs: &mut [Irq], base: u32, first: u32, len: usize, value: u64) {
        fn at(irqs: &mut [Irq], base: u32, id: u32) -> Option<&mut Irq> {
            id.checked_sub(base).and_then(|i| irqs.get_mut(i as usize))
        }
        match self {
            Self::Priority => {
                for i in 0..len as u32 {
                    if let Some(s) = at(irqs, base, first + i) {
                        s.priority = (value >> (8 * i)) as u8 & PRIORITY_MASK;
                    }
                }
            }
            Self::Config => {
                for i in (0..(len as u32 * 4)).filter(|i| first + i >= 16) {
                    if let Some(s) = at(irqs, base, first + i) {
                        s.edge = (value >> (2 * i)) & 2 != 0;
                    }
                }
            }
            _ => {
                for i in 0..(len as u32 * 8) {
                    let bit = (value >> i) & 1 != 0;
                    let Some(s) = at(irqs, base, first + i) else {
                        continue;
                    };
                    match self {
                        Self::Group => s.group1 = bit,
                        _ if !bit => {}
                        Self::SetEnable => s.enabled = true,
                        Self::ClearEnable => s.enabled = false,
                        Self::SetPending => s.latched = true,
                        Self::ClearPending => s.latched = false,
                        Self::SetActive => s.active = true,
                        _ => s.active = false,
                    }
                }
            }
        }
    }
}

impl GicV3 {
    /// A guest read of `len` bytes at `offset` in the distributor frame.
    pub fn dist_read(&mut self, offset: u64, len: usize) -> u64 {
        match offset {
            0x0000 => u64::from(self.ctlr | CTLR_ARE | CTLR_DS),
            0x0004 => {
                let lines = (self.spis.len() as u64 + 32) / 32 - 1;
                // IDbits = 9 (10-bit INTIDs), ITLinesNumber.
                (9 << 19) | lines
            }
            0x0008 => IIDR,
            0x6100..0x7fe0 => {
                let spi = ((offset - 0x6100) / 8) as usize;
                let route = self.spis.get(spi).map_or(0, |irq| irq.route);
                if offset % 8 == 4 {
                    route >> 32
                } else {
                    route & mask(len)
                }
            }
            0xffe8 => PIDR2,
            _ => match Bank::at(offset) {
                // INTIDs 0..32 live in the redistributors (ARE): RAZ here.
                Some((bank, first)) if first >= 32 => bank.read(&self.spis, 32, first, len),
                _ => 0,
            },
        }
    }

    /// A guest write of `len` bytes of `value` at `offset` in the distributor.
    pub fn dist_write(&mut self, offset: u64, len: usize, value: u64) {
        match offset {
            0x0000 => self.ctlr = value as u32 & (CTLR_ENABLE_GRP0 | CTLR_ENABLE_GRP1),
            0x6100..0x7fe0 => {
                let spi = ((offset - 0x6100) / 8) as usize;
                if let Some(irq) = self.spis.get_mut(spi) {
                    irq.route = match (offset % 8, len) {
                        (0, 8) => value,
                        (0, _) => (irq.route & !0xffff_ffff) | (value & 0xffff_ffff),
                        _ => (irq.route & 0xffff_ffff) | (value << 32),
                    };
                }
            }
            _ => {
                if let Some((bank, first)) = Bank::at(offset).filter(|(_, first)| *first >= 32) {
                    bank.write(&mut self.spis, 32, first, len, value);
                }
            }
        }
    }

    /// A guest read of `len` bytes at `offset` in the redistributor region
    /// (vCPU n's frames at n × 128 KiB).
    pub fn redist_read(&mut self, offset: u64, len: usize) -> u64 {
        let (cpu, off) = ((offset / REDIST_STRIDE) as usize, offset % REDIST_STRIDE);
        let last = cpu + 1 == self.cpus.len();
        let Some(c) = self.cpus.get(cpu) else {
            return 0;
        };
        match off {
            0x0004 => IIDR,
            0x0008 => {
                let aff = (c.mpidr & 0xff_ffff) | ((c.mpidr >> 8) & 0xff00_0000);
                let typer = (aff << 32) | ((cpu as u64) << 8) | (u64::from(last) << 4);
                typer & mask(len)
            }
            0x000c => (c.mpidr & 0xff_ffff) | ((c.mpidr >> 8) & 0xff00_0000),
            0x0014 => {
                // ProcessorSleep (bit 1) and ChildrenAsleep (bit 2) follow each other.
                u64::from(c.sleep) * 0b110
            }
            0xffe8 => PIDR2,
            o if o >= SGI_FRAME => match Bank::at(o - SGI_FRAME) {
                Some((bank, first)) if first < 32 => bank.read(&c.private, 0, first, len),
                _ => 0,
            },
            _ => 0,
        }
    }

    /// A guest write of `len` bytes of `value` at `offset` in the
    /// redistributor region.
    pub fn redist_write(&mut self, offset: u64, len: usize, value: u64) {
        let (cpu, off) = ((offset / REDIST_STRIDE) as usize, offset % REDIST_STRIDE);
        let Some(c) = self.cpus.get_mut(cpu) else {
            return;
        };
        match off {
            0x0014 => c.sleep = value & 0b10 != 0,
            o if o >= SGI_FRAME => {
                if let Some((bank, first)) = Bank::at(o - SGI_FRAME).filter(|(_, f)| *f < 32) {
                    bank.write(&mut c.private, 0, first, len, value);
                }
            }
            _ => {}
        }
    }
}

fn mask(len: usize) -> u64 {
    if len >= 8 {
        u64::MAX
    } else {
        (1 << (8 * len)) - 1
    }
}
