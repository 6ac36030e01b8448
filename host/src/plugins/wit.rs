//! The WIT contract (`wit/smallrl-reward.wit`): the bindings bindgen generates for its three
//! worlds, and the package version, written once here; plus the bindings of the frozen
//! previous versions (`wit/0.5.0/`, `wit/0.4.0/`, `wit/0.3.0/`, `wit/0.2.0/`, `wit/0.1.0/`),
//! which the host still runs ([`Contract`]).
//!
//! Architecture invariant: every versioned name the host matches (the host interfaces it
//! provides, the contract it reports) derives from [`VERSION`], [`V0_5_VERSION`], [`V0_4_VERSION`],
//! [`V0_3_VERSION`], [`V0_2_VERSION`] and [`LEGACY_VERSION`]; a test holds them to the WIT files.

/// The contract's package and version as literals (for `concat!`).
macro_rules! wit_package {
    () => {
        "smallrl:reward"
    };
}
macro_rules! wit_version {
    () => {
        "0.6.0"
    };
}
macro_rules! v0_5_wit_version {
    () => {
        "0.5.0"
    };
}
macro_rules! v0_4_wit_version {
    () => {
        "0.4.0"
    };
}
macro_rules! v0_3_wit_version {
    () => {
        "0.3.0"
    };
}
macro_rules! v0_2_wit_version {
    () => {
        "0.2.0"
    };
}
macro_rules! legacy_wit_version {
    () => {
        "0.1.0"
    };
}

/// The `smallrl:reward` package version this host speaks.
pub const VERSION: &str = wit_version!();
/// The package with its version, as components name it.
pub const CONTRACT: &str = concat!(wit_package!(), "@", wit_version!());
/// What the contract's interface names start with (as in `smallrl:reward/host@0.2.0`).
pub const INTERFACE_PREFIX: &str = concat!(wit_package!(), "/");
/// The versions of the `smallrl:reward` interfaces `component` exports (any version, runnable
/// here or not).
pub fn exported_versions(component: &wasmtime::component::Component, engine: &wasmtime::Engine) -> Vec<String> {
    component
        .component_type()
        .exports(engine)
        .filter_map(|(name, _)| name.strip_prefix(INTERFACE_PREFIX).and_then(|rest| rest.split_once('@')).map(|(_, version)| version.to_string()))
        .collect()
}

/// The oldest contract version (frozen in `wit/0.1.0/`), still run: no `sample.metadata`.
pub const LEGACY_VERSION: &str = legacy_wit_version!();
/// A previous contract version (frozen in `wit/0.2.0/`), still run: the reward and detector
/// worlds of the current one, without the `environment` world.
pub const V0_2_VERSION: &str = v0_2_wit_version!();
/// The previous contract version (frozen in `wit/0.5.0/`), still run: the current worlds, but an
/// episode environment declares no tools and its turns carry no parsed calls.
pub const V0_5_VERSION: &str = v0_5_wit_version!();
/// A previous contract version (frozen in `wit/0.4.0/`), still run: 0.5's worlds with
/// a score per sample that is always present (`list<f64>`, not `list<option<f64>>`).
pub const V0_4_VERSION: &str = v0_4_wit_version!();
/// A previous contract version (frozen in `wit/0.3.0/`), still run: 0.4's exports, without the
/// `programs` import.
pub const V0_3_VERSION: &str = v0_3_wit_version!();
/// The versioned names of the judge interface environments may import (contracts 0.6 to 0.3).
pub const JUDGE_INTERFACES: [&str; 4] = [
    concat!(wit_package!(), "/judge@", wit_version!()),
    concat!(wit_package!(), "/judge@", v0_5_wit_version!()),
    concat!(wit_package!(), "/judge@", v0_4_wit_version!()),
    concat!(wit_package!(), "/judge@", v0_3_wit_version!()),
];

/// The versioned names of the program runner's interface plugins may import (contracts 0.6, 0.5
/// and 0.4; the first is the current one).
pub const PROGRAMS_INTERFACES: [&str; 3] = [
    concat!(wit_package!(), "/programs@", wit_version!()),
    concat!(wit_package!(), "/programs@", v0_5_wit_version!()),
    concat!(wit_package!(), "/programs@", v0_4_wit_version!()),
];

/// Which of the contracts a plugin was built against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Contract {
    /// [`VERSION`] (0.6.x): rewards, detectors and environments, which may run programs and
    /// leave a sample without a score; episodes with tools.
    Current,
    /// [`V0_5_VERSION`] (0.5.x): the same calls, episodes without tools.
    V0_5,
    /// [`V0_4_VERSION`] (0.4.x): the same calls, a score for every sample.
    V0_4,
    /// [`V0_3_VERSION`] (0.3.x): 0.4's exports, no `programs` import.
    V0_3,
    /// [`V0_2_VERSION`] (0.2.x): the same reward and detector calls (no environments).
    V0_2,
    /// [`LEGACY_VERSION`] (0.1.x): the same calls, samples without metadata.
    Legacy,
}

impl Contract {
    pub fn version(self) -> &'static str {
        match self {
            Contract::Current => VERSION,
            Contract::V0_5 => V0_5_VERSION,
            Contract::V0_4 => V0_4_VERSION,
            Contract::V0_3 => V0_3_VERSION,
            Contract::V0_2 => V0_2_VERSION,
            Contract::Legacy => LEGACY_VERSION,
        }
    }
}

/// The contract a version belongs to (same major.minor: the 0.x versions are compatible
/// within a minor version), or None for one this host cannot run.
pub fn contract_of(version: &str) -> Option<Contract> {
    let minor = |v: &str| v.rsplit_once('.').map(|(head, _)| head.to_string());
    match minor(version)? {
        m if Some(&m) == minor(VERSION).as_ref() => Some(Contract::Current),
        m if Some(&m) == minor(V0_5_VERSION).as_ref() => Some(Contract::V0_5),
        m if Some(&m) == minor(V0_4_VERSION).as_ref() => Some(Contract::V0_4),
        m if Some(&m) == minor(V0_3_VERSION).as_ref() => Some(Contract::V0_3),
        m if Some(&m) == minor(V0_2_VERSION).as_ref() => Some(Contract::V0_2),
        m if Some(&m) == minor(LEGACY_VERSION).as_ref() => Some(Contract::Legacy),
        _ => None,
    }
}

pub fn compatible(version: &str) -> bool {
    contract_of(version).is_some()
}


pub mod reward {
    wasmtime::component::bindgen!({
        world: "reward",
        path: "../wit",
        // A runner that cannot run ends the plugin's call (a trap), not just the import.
        imports: { "smallrl:reward/programs.run": trappable },
    });
}
pub mod detector {
    wasmtime::component::bindgen!({
        world: "detector",
        path: "../wit",
        with: {
            "smallrl:reward/types": super::reward::smallrl::reward::types,
            "smallrl:reward/host": super::reward::smallrl::reward::host,
            "smallrl:reward/programs": super::reward::smallrl::reward::programs,
        },
    });
}

pub mod environment {
    wasmtime::component::bindgen!({
        world: "environment",
        path: "../wit",
        // An environment over its judge budget ends the call (a trap), not just the judge call.
        imports: { "smallrl:reward/judge.judge": trappable },
        with: {
            "smallrl:reward/types": super::reward::smallrl::reward::types,
            "smallrl:reward/host": super::reward::smallrl::reward::host,
            "smallrl:reward/programs": super::reward::smallrl::reward::programs,
        },
    });
}

/// The multi-turn environment (issue 48): the environment's imports and `env` export, plus
/// `episodes`.
pub mod episode_environment {
    wasmtime::component::bindgen!({
        world: "episode-environment",
        path: "../wit",
        with: {
            "smallrl:reward/types": super::reward::smallrl::reward::types,
            "smallrl:reward/host": super::reward::smallrl::reward::host,
            "smallrl:reward/programs": super::reward::smallrl::reward::programs,
            "smallrl:reward/environment-types": crate::plugins::wit::env_types,
            "smallrl:reward/judge": crate::plugins::wit::environment::smallrl::reward::judge,
        },
    });
}

pub use detector::{Detector, DetectorPre};
pub use episode_environment::smallrl::reward::episode_types;
pub use episode_environment::{EpisodeEnvironment, EpisodeEnvironmentPre};
pub use environment::smallrl::reward::environment_types as env_types;
pub use reward::smallrl::reward::programs;
pub use environment::{Environment, EnvironmentPre};
pub use reward::smallrl::reward::types;
pub use reward::{Reward, RewardPre};

/// The frozen 0.5.0 contract's bindings (`wit/0.5.0/smallrl-reward.wit`). Its `types`,
/// `programs` and `environment-types` are the current contract's field for field, so the
/// bindings reuse them; its `episode-types` differ (no tools, no calls), so they are its own.
/// Its `host`, `judge` and `programs` imports carry 0.5.0 in their names: `runtime.rs` links
/// them to the current functions.
pub mod v0_5 {
    pub mod reward {
        wasmtime::component::bindgen!({
            world: "reward",
            path: "../wit/0.5.0",
            with: {
                "smallrl:reward/types": crate::plugins::wit::types,
                "smallrl:reward/programs": crate::plugins::wit::programs,
            },
        });
    }
    pub mod detector {
        wasmtime::component::bindgen!({
            world: "detector",
            path: "../wit/0.5.0",
            with: {
                "smallrl:reward/types": crate::plugins::wit::types,
                "smallrl:reward/host": super::reward::smallrl::reward::host,
                "smallrl:reward/programs": crate::plugins::wit::programs,
            },
        });
    }
    pub mod environment {
        wasmtime::component::bindgen!({
            world: "environment",
            path: "../wit/0.5.0",
            imports: { "smallrl:reward/judge.judge": trappable },
            with: {
                "smallrl:reward/types": crate::plugins::wit::types,
                "smallrl:reward/host": super::reward::smallrl::reward::host,
                "smallrl:reward/programs": crate::plugins::wit::programs,
                "smallrl:reward/environment-types": crate::plugins::wit::env_types,
            },
        });
    }
    pub mod episode_environment {
        wasmtime::component::bindgen!({
            world: "episode-environment",
            path: "../wit/0.5.0",
            with: {
                "smallrl:reward/types": crate::plugins::wit::types,
                "smallrl:reward/host": super::reward::smallrl::reward::host,
                "smallrl:reward/programs": crate::plugins::wit::programs,
                "smallrl:reward/environment-types": crate::plugins::wit::env_types,
                "smallrl:reward/judge": crate::plugins::wit::v0_5::environment::smallrl::reward::judge,
            },
        });
    }
    pub use detector::{Detector, DetectorPre};
    pub use environment::{Environment, EnvironmentPre};
    pub use episode_environment::smallrl::reward::episode_types;
    pub use episode_environment::{EpisodeEnvironment, EpisodeEnvironmentPre};
    pub use reward::{Reward, RewardPre};
}

/// The frozen 0.4.0 contract's bindings (`wit/0.4.0/smallrl-reward.wit`). Its `types` and
/// `programs` records are the current contract's field for field, so the bindings reuse them (a
/// 0.4 plugin receives exactly the samples a 0.5 one does); its `environment-types` differ in
/// `scores` (a score per sample, no option), so they are its own (`legacy_env.rs` converts
/// them). Its `host`, `judge` and `programs` imports carry 0.4.0 in their names: `runtime.rs`
/// links them to the current functions.
pub mod v0_4 {
    pub mod reward {
        wasmtime::component::bindgen!({
            world: "reward",
            path: "../wit/0.4.0",
            with: {
                "smallrl:reward/types": crate::plugins::wit::types,
                "smallrl:reward/programs": crate::plugins::wit::programs,
            },
        });
    }
    pub mod detector {
        wasmtime::component::bindgen!({
            world: "detector",
            path: "../wit/0.4.0",
            with: {
                "smallrl:reward/types": crate::plugins::wit::types,
                "smallrl:reward/host": super::reward::smallrl::reward::host,
                "smallrl:reward/programs": crate::plugins::wit::programs,
            },
        });
    }
    pub mod environment {
        wasmtime::component::bindgen!({
            world: "environment",
            path: "../wit/0.4.0",
            imports: { "smallrl:reward/judge.judge": trappable },
            with: {
                "smallrl:reward/types": crate::plugins::wit::types,
                "smallrl:reward/host": super::reward::smallrl::reward::host,
                "smallrl:reward/programs": crate::plugins::wit::programs,
            },
        });
    }
    pub use detector::{Detector, DetectorPre};
    pub use environment::smallrl::reward::environment_types as env_types;
    pub use environment::{Environment, EnvironmentPre};
    pub use reward::{Reward, RewardPre};
}

/// The frozen 0.3.0 contract's bindings (`wit/0.3.0/smallrl-reward.wit`). Its records are
/// those of 0.4 field for field, so the bindings reuse 0.4's types: a 0.3 plugin receives
/// exactly the samples a 0.5 one does. Its `host` and `judge` imports are its own (their names
/// carry 0.3.0), with the same functions as the current ones.
pub mod v0_3 {
    pub mod reward {
        wasmtime::component::bindgen!({
            world: "reward",
            path: "../wit/0.3.0",
            with: { "smallrl:reward/types": crate::plugins::wit::types },
        });
    }
    pub mod detector {
        wasmtime::component::bindgen!({
            world: "detector",
            path: "../wit/0.3.0",
            with: {
                "smallrl:reward/types": crate::plugins::wit::types,
                "smallrl:reward/host": super::reward::smallrl::reward::host,
            },
        });
    }
    pub mod environment {
        wasmtime::component::bindgen!({
            world: "environment",
            path: "../wit/0.3.0",
            imports: { "smallrl:reward/judge.judge": trappable },
            with: {
                "smallrl:reward/types": crate::plugins::wit::types,
                "smallrl:reward/environment-types": crate::plugins::wit::v0_4::env_types,
                "smallrl:reward/host": super::reward::smallrl::reward::host,
            },
        });
    }
    pub use detector::{Detector, DetectorPre};
    pub use environment::{Environment, EnvironmentPre};
    pub use reward::{Reward, RewardPre};
}

/// The frozen 0.2.0 contract's bindings (`wit/0.2.0/smallrl-reward.wit`). Its records are
/// those of the current contract field for field, so the bindings reuse the current types:
/// a 0.2 plugin receives exactly the samples a 0.3 one does.
pub mod v0_2 {
    pub mod reward {
        wasmtime::component::bindgen!({
            world: "reward",
            path: "../wit/0.2.0",
            with: { "smallrl:reward/types": crate::plugins::wit::types },
        });
    }
    pub mod detector {
        wasmtime::component::bindgen!({
            world: "detector",
            path: "../wit/0.2.0",
            with: {
                "smallrl:reward/types": crate::plugins::wit::types,
                "smallrl:reward/host": super::reward::smallrl::reward::host,
            },
        });
    }
    pub use detector::{Detector, DetectorPre};
    pub use reward::{Reward, RewardPre};
}

/// The frozen 0.1.0 contract's bindings (`wit/0.1.0/smallrl-reward.wit`).
pub mod legacy {
    pub mod reward {
        wasmtime::component::bindgen!({ world: "reward", path: "../wit/0.1.0" });
    }
    pub mod detector {
        wasmtime::component::bindgen!({
            world: "detector",
            path: "../wit/0.1.0",
            with: {
                "smallrl:reward/types": super::reward::smallrl::reward::types,
                "smallrl:reward/host": super::reward::smallrl::reward::host,
            },
        });
    }
    pub use detector::{Detector, DetectorPre};
    pub use reward::smallrl::reward::types;
    pub use reward::{Reward, RewardPre};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_is_the_wit_files() {
        let package = |file: &str| {
            let wit = std::fs::read_to_string(format!("{}/../wit/{file}", env!("CARGO_MANIFEST_DIR"))).unwrap();
            wit.lines().find_map(|l| l.trim().strip_prefix("package ").map(|p| p.trim_end_matches(';').to_string())).expect("the WIT file declares its package")
        };
        assert_eq!(package("smallrl-reward.wit"), CONTRACT);
        assert_eq!(package("0.5.0/smallrl-reward.wit"), format!("smallrl:reward@{V0_5_VERSION}"));
        assert_eq!(package("0.4.0/smallrl-reward.wit"), format!("smallrl:reward@{V0_4_VERSION}"));
        assert_eq!(package("0.3.0/smallrl-reward.wit"), format!("smallrl:reward@{V0_3_VERSION}"));
        assert_eq!(package("0.2.0/smallrl-reward.wit"), format!("smallrl:reward@{V0_2_VERSION}"));
        assert_eq!(package("0.1.0/smallrl-reward.wit"), format!("smallrl:reward@{LEGACY_VERSION}"));
        assert_eq!(contract_of("0.6.1"), Some(Contract::Current));
        assert_eq!(contract_of("0.5.1"), Some(Contract::V0_5));
        assert_eq!(contract_of("0.4.1"), Some(Contract::V0_4));
        assert_eq!(contract_of("0.3.1"), Some(Contract::V0_3));
        assert_eq!(contract_of("0.2.3"), Some(Contract::V0_2));
        assert_eq!(contract_of("0.1.7"), Some(Contract::Legacy));
        assert!(!compatible("0.7.0") && !compatible("1.1.0") && !compatible("1.2.0") && !compatible("garbage"));
    }
}
