//! smallrl: GRPO with gradient routing on tiny LLaMA models.
//!
//! The binary (`src/main.rs`) is a thin shell over this library; `ARCHITECTURE.md` at the
//! repository root describes how the modules fit together and what may depend on what.

pub mod adapters;
pub mod choice;
pub mod cli;
pub mod corpus;
pub mod dataset;
pub mod defaults;
pub mod device;
pub mod engine;
pub mod episode;
pub mod eval;
pub mod fsutil;
pub mod grpo;
pub mod hyperparams;
pub mod intervention;
pub mod judge;
pub mod model;
pub mod optim;
pub mod pretrain;
pub mod plugins;
pub mod probes;
pub mod reward;
pub mod rng;
pub mod routing;
pub mod rundir;
pub mod runlog;
pub mod stats;
pub mod sweep;
pub mod tensorboard;
pub mod train;
pub mod wandb;
pub mod yaml;
