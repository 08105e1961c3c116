//! Fuzzes a bundle's `config.json` as `boxdesk oci create` reads it
//! (`boxdesk_oci::config::check_bytes`): the JSON, the walk of every field
//! against what boxdesk honours, oci-spec's typed reading, and the plan —
//! mounts and their options, namespaces, resources, rlimits, sysctls,
//! capabilities, and the seccomp profile compiled to BPF.
//!
//! * Any input is a plan or an error, never a panic.
//! * A plan never names a sysctl outside the container's namespaces, nor
//!   a mount destination that is relative or climbs with `..`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(plan) = boxdesk_oci::config::check_bytes(data) else {
        return;
    };
    for (key, _) in &plan.sysctls {
        assert!(boxdesk_oci::config::check_sysctl(key, plan.net_host).is_ok(), "{key}");
    }
    for m in &plan.layout.mounts {
        use boxdesk_sandbox::container::Mount;
        let dest = match m {
            Mount::Proc { dest }
            | Mount::Dev { dest }
            | Mount::Mqueue { dest }
            | Mount::Sysfs { dest }
            | Mount::Tmpfs { dest, .. }
            | Mount::Bind { dest, .. } => dest,
        };
        assert!(dest.is_absolute(), "{}", dest.display());
        assert!(!dest.components().any(|c| c == std::path::Component::ParentDir));
    }
});
