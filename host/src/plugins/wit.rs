//! The WIT contract (`wit/smallrl-reward.wit`): the bindings bindgen generates for its two
//! worlds, and the package version, written once here.
//!
//! Architecture invariant: every versioned name the host matches (the host interface it
//! provides, the contract it reports) derives from [`VERSION`]; a test holds it to the WIT file.

/// The contract's package and version as literals (for `concat!`).
macro_rules! wit_package {
    () => {
        "smallrl:reward"
    };
}
macro_rules! wit_version {
    () => {
        "0.1.0"
    };
}

/// The `smallrl:reward` package version this host speaks.
pub const VERSION: &str = wit_version!();
/// The package with its version, as components name it.
pub const CONTRACT: &str = concat!(wit_package!(), "@", wit_version!());
/// What the contract's interface names start with (`smallrl:reward/host@0.1.0`).
pub const INTERFACE_PREFIX: &str = concat!(wit_package!(), "/");
/// The versioned name of the only instance the host provides.
pub const HOST_INTERFACE: &str = concat!(wit_package!(), "/host@", wit_version!());

/// Whether a component's contract version is one this host can run (same major.minor: the
/// 0.x versions are compatible within a minor version).
pub fn compatible(version: &str) -> bool {
    let minor = |v: &str| v.rsplit_once('.').map(|(head, _)| head.to_string());
    minor(version).is_some() && minor(version) == minor(VERSION)
}


pub mod reward {
    wasmtime::component::bindgen!({ world: "reward", path: "../wit" });
}
pub mod detector {
    wasmtime::component::bindgen!({
        world: "detector",
        path: "../wit",
        with: {
            "smallrl:reward/types": super::reward::smallrl::reward::types,
            "smallrl:reward/host": super::reward::smallrl::reward::host,
        },
    });
}

pub use detector::{Detector, DetectorPre};
pub use reward::smallrl::reward::types;
pub use reward::{Reward, RewardPre};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_is_the_wit_files() {
        let wit = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../wit/smallrl-reward.wit")).unwrap();
        let package = wit.lines().find_map(|l| l.trim().strip_prefix("package ")).expect("the WIT file declares its package");
        assert_eq!(package.trim_end_matches(';'), CONTRACT);
        assert!(compatible("0.1.7") && !compatible("0.2.0") && !compatible("1.1.0"));
    }
}
