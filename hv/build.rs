//! Backend selection: `#[cfg(kvm)]` on Linux, `#[cfg(hvf)]` on macOS/aarch64.
fn main() {
    cfg_aliases::cfg_aliases! {
        kvm: { target_os = "linux" },
        hvf: { all(target_os = "macos", target_arch = "aarch64") },
    }
}
