//! Mixed precision for the model's passes (`train_dtype`), as `torch.autocast` does it: the
//! matrix products (linear layers, adapters, attention, the output head) take bfloat16 inputs
//! and give bfloat16 results; everything else (the residual stream, norms, RoPE, softmax and
//! log-softmax, the loss, the weights, their gradients and the optimizer) stays float32, since
//! PyTorch's type promotion turns `float32 + bfloat16` back into float32.
//!
//! Like `torch.autocast`, the setting is a thread's: [`Llama::forward_masked`] and the output
//! head enter it from the model's own [`Llama::autocast`] for the duration of the pass, so the
//! policy's, the reference's and the old policy's passes all follow it wherever the engine
//! runs them; the backward pass follows the forward's kinds through autograd. Decoders never
//! enter it (`sampler_dtype` is theirs).
//!
//! [`Llama::forward_masked`]: super::Llama::forward_masked
//! [`Llama::autocast`]: super::Llama::autocast

use std::cell::Cell;

use tch::{Kind, Tensor};

crate::choice::choice! {
    /// The precision of the training passes' matrix products (`train_dtype`): float32, or
    /// bfloat16 with float32 master weights, as TRL's `bf16=True` (torch.autocast).
    pub enum TrainDtype ("train_dtype") {
        Float32 = "float32",
        Bfloat16 = "bfloat16",
    }
}

impl TrainDtype {
    /// The kind the model's matrix products run in (`None`: the model's own).
    pub fn matmul_kind(self) -> Option<Kind> {
        match self {
            Self::Float32 => None,
            Self::Bfloat16 => Some(Kind::BFloat16),
        }
    }
}

thread_local! {
    static MATMUL_KIND: Cell<Option<Kind>> = const { Cell::new(None) };
}

/// The thread's setting while it lives; the previous one again when dropped.
pub struct Entered(Option<Kind>);

impl Drop for Entered {
    fn drop(&mut self) {
        MATMUL_KIND.set(self.0);
    }
}

/// Matrix products in `kind` (or the operands' own kind for `None`) until the guard drops.
#[must_use = "the setting lasts as long as the guard"]
pub fn enter(kind: Option<Kind>) -> Entered {
    Entered(MATMUL_KIND.replace(kind))
}

/// The kind matrix products run in on this thread, if not the operands' own.
fn matmul_kind() -> Option<Kind> {
    MATMUL_KIND.get()
}

/// `x` in the thread's matrix-product kind (itself when there is none).
pub fn cast(x: &Tensor) -> Tensor {
    match matmul_kind() {
        Some(kind) if x.kind() != kind => x.to_kind(kind),
        _ => x.shallow_clone(),
    }
}

/// `x.matmul(w)` with both operands in the thread's kind: a bfloat16 result under bfloat16.
pub fn matmul(x: &Tensor, w: &Tensor) -> Tensor {
    cast(x).matmul(&cast(w))
}

/// `input + x w` (`addmm`), as [`matmul`].
pub fn addmm(input: &Tensor, x: &Tensor, w: &Tensor) -> Tensor {
    cast(input).addmm(&cast(x), &cast(w))
}

/// `x.bmm(w)`, as [`matmul`].
pub fn bmm(x: &Tensor, w: &Tensor) -> Tensor {
    cast(x).bmm(&cast(w))
}
