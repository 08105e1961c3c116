use super::*;
use crate::arch::aarch64::{SysReg, VTIMER_INTID};

const REDIST_SGI: u64 = 0x1_0000;

/// What Linux's GICv3 driver does before it takes interrupts: enable group 1
/// in the distributor, wake each redistributor, open the CPU interfaces.
fn booted(vcpus: u32, spis: u32) -> GicV3 {
    let mut gic = GicV3::new(vcpus, spis);
    gic.dist_write(0, 4, 0x2);
    for cpu in 0..vcpus as usize {
        gic.redist_write(cpu as u64 * 0x2_0000 + 0x14, 4, 0);
        assert!(gic.sysreg_write(cpu, SysReg::ICC_PMR_EL1, 0xf0));
        assert!(gic.sysreg_write(cpu, SysReg::ICC_IGRPEN1_EL1, 1));
        gic.redist_write(cpu as u64 * 0x2_0000 + REDIST_SGI + 0x80, 4, u64::MAX);
    }
    gic.dist_write(0x84, 4, 0xffff_ffff); // SPIs 32..64 into group 1
    gic
}

fn enable_spi(gic: &mut GicV3, spi: u32, priority: u8) {
    let intid = spi + 32;
    gic.dist_write(0x100 + u64::from(intid / 32) * 4, 4, 1 << (intid % 32));
    gic.dist_write(0x400 + u64::from(intid), 1, priority.into());
}

fn iar(gic: &mut GicV3, cpu: usize) -> u32 {
    gic.sysreg_read(cpu, SysReg::ICC_IAR1_EL1).unwrap() as u32
}

#[test]
fn an_spi_is_delivered_only_once_distributor_cpu_interface_and_irq_are_enabled() {
    let mut gic = GicV3::new(1, 32);
    gic.set_spi_level(3, true);
    assert!(!gic.irq_pending(0));
    gic.dist_write(0, 4, 0x2);
    gic.dist_write(0x84, 4, 0xffff_ffff);
    enable_spi(&mut gic, 3, 0x80);
    assert!(!gic.irq_pending(0), "cpu interface still closed");
    gic.sysreg_write(0, SysReg::ICC_IGRPEN1_EL1, 1);
    gic.sysreg_write(0, SysReg::ICC_PMR_EL1, 0xff);
    assert!(gic.irq_pending(0));
    assert_eq!(iar(&mut gic, 0), 35);
}

#[test]
fn the_highest_priority_interrupt_is_acknowledged_first() {
    let mut gic = booted(1, 32);
    enable_spi(&mut gic, 1, 0xa0);
    enable_spi(&mut gic, 2, 0x20);
    gic.set_spi_level(1, true);
    gic.set_spi_level(2, true);
    assert_eq!(gic.sysreg_read(0, SysReg::ICC_HPPIR1_EL1), Some(34));
    assert_eq!(iar(&mut gic, 0), 34);
    assert_eq!(gic.sysreg_read(0, SysReg::ICC_RPR_EL1), Some(0x20));
    assert!(!gic.irq_pending(0), "0xa0 cannot preempt a running 0x20");
    assert_eq!(iar(&mut gic, 0), SPURIOUS);
    gic.set_spi_level(2, false);
    gic.sysreg_write(0, SysReg::ICC_EOIR1_EL1, 34);
    assert_eq!(gic.sysreg_read(0, SysReg::ICC_RPR_EL1), Some(0xff));
    assert_eq!(iar(&mut gic, 0), 33);
}

#[test]
fn a_level_spi_is_pending_again_after_eoi_while_its_line_stays_high() {
    let mut gic = booted(1, 32);
    enable_spi(&mut gic, 0, 0x80);
    gic.set_spi_level(0, true);
    assert_eq!(iar(&mut gic, 0), 32);
    assert!(
        !gic.irq_pending(0),
        "active interrupts are not signalled again"
    );
    gic.sysreg_write(0, SysReg::ICC_EOIR1_EL1, 32);
    assert!(gic.irq_pending(0));
    gic.set_spi_level(0, false);
    assert!(!gic.irq_pending(0));
}

#[test]
fn an_edge_spi_fires_once_per_rising_edge() {
    let mut gic = booted(1, 32);
    gic.dist_write(0xc08, 4, 2 << (2 * 4)); // INTID 36 edge-triggered
    enable_spi(&mut gic, 4, 0x80);
    gic.set_spi_level(4, true);
    assert_eq!(iar(&mut gic, 0), 36);
    gic.sysreg_write(0, SysReg::ICC_EOIR1_EL1, 36);
    assert!(
        !gic.irq_pending(0),
        "the line is still high, but no new edge"
    );
    gic.set_spi_level(4, false);
    gic.set_spi_level(4, true);
    assert!(gic.irq_pending(0));
}

#[test]
fn the_priority_mask_holds_back_lower_priority_interrupts() {
    let mut gic = booted(1, 32);
    enable_spi(&mut gic, 0, 0xf0);
    gic.set_spi_level(0, true);
    assert!(!gic.irq_pending(0), "0xf0 is not below PMR 0xf0");
    gic.sysreg_write(0, SysReg::ICC_PMR_EL1, 0xf8);
    assert!(gic.irq_pending(0));
}

#[test]
fn with_eoi_mode_1_the_interrupt_stays_active_until_dir() {
    let mut gic = booted(1, 32);
    gic.sysreg_write(0, SysReg::ICC_CTLR_EL1, 1 << 1);
    enable_spi(&mut gic, 0, 0x80);
    gic.set_spi_level(0, true);
    assert_eq!(iar(&mut gic, 0), 32);
    gic.sysreg_write(0, SysReg::ICC_EOIR1_EL1, 32);
    assert!(!gic.irq_pending(0), "priority dropped but still active");
    gic.sysreg_write(0, SysReg::ICC_DIR_EL1, 32);
    assert!(gic.irq_pending(0));
}

#[test]
fn an_sgi_reaches_only_the_listed_vcpu() {
    let mut gic = booted(2, 32);
    for cpu in 0..2 {
        gic.redist_write(cpu * 0x2_0000 + REDIST_SGI + 0x100, 4, 1 << 5);
    }
    gic.sysreg_write(0, SysReg::ICC_SGI1R_EL1, (5 << 24) | 0b10);
    assert!(!gic.irq_pending(0));
    assert_eq!(iar(&mut gic, 1), 5);
}

#[test]
fn an_sgi_to_all_others_skips_the_sender() {
    let mut gic = booted(3, 32);
    for cpu in 0..3 {
        gic.redist_write(cpu * 0x2_0000 + REDIST_SGI + 0x100, 4, 1 << 1);
    }
    gic.sysreg_write(1, SysReg::ICC_SGI1R_EL1, (1 << 40) | (1 << 24));
    assert!(gic.irq_pending(0) && !gic.irq_pending(1) && gic.irq_pending(2));
}

#[test]
fn irouter_sends_an_spi_to_the_vcpu_with_that_affinity() {
    let mut gic = booted(2, 32);
    enable_spi(&mut gic, 7, 0x80);
    gic.dist_write(0x6100 + 7 * 8, 8, 1); // Aff0 = 1
    gic.set_spi_level(7, true);
    assert!(!gic.irq_pending(0));
    assert_eq!(iar(&mut gic, 1), 39);
    assert_eq!(gic.dist_read(0x6100 + 7 * 8, 8), 1);
}

#[test]
fn the_virtual_timer_ppi_is_banked_per_vcpu() {
    let mut gic = booted(2, 32);
    let ppi = u64::from(VTIMER_INTID);
    gic.redist_write(0x2_0000 + REDIST_SGI + 0x100, 4, 1 << ppi);
    gic.redist_write(0x2_0000 + REDIST_SGI + 0x400 + ppi, 1, 0x40);
    gic.set_ppi_level(1, VTIMER_INTID, true);
    assert!(!gic.irq_pending(0));
    assert_eq!(iar(&mut gic, 1), VTIMER_INTID);
    assert_eq!(
        gic.redist_read(0x2_0000 + REDIST_SGI + 0x300, 4),
        1 << ppi,
        "active"
    );
}

#[test]
fn enable_pending_and_priority_registers_read_back() {
    let mut gic = booted(1, 64);
    enable_spi(&mut gic, 40, 0x48);
    assert_eq!(gic.dist_read(0x108, 4), 1 << 8);
    assert_eq!(gic.dist_read(0x400 + 72, 1), 0x48);
    gic.dist_write(0x208, 4, 1 << 8);
    assert_eq!(gic.dist_read(0x288, 4), 1 << 8, "set through ISPENDR");
    gic.dist_write(0x188, 4, 1 << 8);
    assert_eq!(gic.dist_read(0x108, 4), 0);
    gic.dist_write(0x400 + 72, 1, 0xff);
    assert_eq!(gic.dist_read(0x400 + 72, 1), 0xf8, "5 priority bits");
}

#[test]
fn the_distributor_identifies_itself_as_a_gicv3_with_its_spi_count() {
    let mut gic = GicV3::new(1, 64);
    assert_eq!(gic.dist_read(0xffe8, 4), 0x3b);
    assert_eq!(gic.dist_read(0x4, 4) & 0x1f, 2, "96 INTIDs");
    assert_eq!(gic.dist_read(0, 4) & 0x50, 0x50, "ARE and DS");
    assert_eq!(gic.dist_read(0x100, 4), 0, "private INTIDs are RAZ in GICD");
}

#[test]
fn the_last_redistributor_says_so_and_reports_its_affinity() {
    let mut gic = GicV3::new(18, 32);
    let typer = gic.redist_read(17 * 0x2_0000 + 8, 8);
    assert_eq!(typer & (1 << 4), 1 << 4, "Last");
    assert_eq!(typer >> 32, 0x0101, "Aff1 = 1, Aff0 = 1 for vCPU 17");
    assert_eq!(gic.redist_read(8, 8) & (1 << 4), 0);
}

#[test]
fn a_redistributor_wakes_when_processor_sleep_is_cleared() {
    let mut gic = GicV3::new(1, 32);
    assert_eq!(gic.redist_read(0x14, 4), 0b110);
    gic.redist_write(0x14, 4, 0);
    assert_eq!(gic.redist_read(0x14, 4), 0);
}

#[test]
fn registers_outside_the_cpu_interface_are_not_claimed() {
    let mut gic = GicV3::new(1, 32);
    assert_eq!(gic.sysreg_read(0, SysReg::MPIDR_EL1), None);
    assert!(!gic.sysreg_write(0, SysReg::CNTV_CTL_EL0, 1));
    assert_eq!(
        gic.sysreg_read(5, SysReg::ICC_PMR_EL1),
        None,
        "no such vCPU"
    );
}

#[test]
fn vcpus_added_one_by_one_get_their_own_redistributor() {
    let mut gic = GicV3::new(0, 32);
    assert_eq!((gic.add_vcpu(0), gic.add_vcpu(1)), (0, 1));
    assert_eq!(gic.vcpus(), 2);
    assert_eq!(
        gic.redist_read(0x2_0000 + 8, 8) & (1 << 4),
        1 << 4,
        "vCPU 1 is now last"
    );
}
