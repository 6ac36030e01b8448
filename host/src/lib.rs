//! smallrl: GRPO with gradient routing on tiny LLaMA models.
//!
//! The binary (`src/main.rs`) is a thin shell over this library; `ARCHITECTURE.md` at the
//! repository root describes how the modules fit together and what may depend on what.

pub mod cli;
pub mod device;
pub mod model;
pub mod plugins;
pub mod reward;
pub mod yaml;
