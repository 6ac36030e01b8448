use std::time::Instant;
use smallrl::model::{self, decode::DecodeModel};
use tch::{Device, Kind, Tensor};
fn main() {
    tch::set_num_threads(1);
    let _g = tch::no_grad_guard();
    let l = model::load("../shared/fixtures/tiny-random", "main", Device::Cpu, Kind::Float).unwrap();
    let d = DecodeModel::new(&l.model, &[]);
    let b = 32; let cap = 136;
    let mut cache = d.new_cache(b, cap);
    let ids = Tensor::ones([b, 1], (Kind::Int64, Device::Cpu));
    let pos = Tensor::ones([b, 1], (Kind::Int64, Device::Cpu)) * 10;
    let mask = Tensor::ones([b, 1, 1, cap], (Kind::Bool, Device::Cpu));
    for round in 0..3 {
        let s = Instant::now();
        for step in 0..128 { let h = d.forward(&ids, &pos, &mut cache, 8 + (step % 128), &mask); let _ = d.logits(&h); }
        println!("round {round}: forward+logits {:.3} ms/step", s.elapsed().as_secs_f64() * 1e3 / 128.0);
    }
    let logits = Tensor::randn([b, 4096], (Kind::Float, Device::Cpu));
    let s = Instant::now();
    for _ in 0..128 {
        let lp = logits.log_softmax(-1, Kind::Float);
        let p = lp.exp();
        let cdf = p.cumsum(-1, Kind::Double);
        let total = cdf.narrow(1, 4095, 1);
        let draw = Tensor::rand([b, 1], (Kind::Double, Device::Cpu)) * total;
        let t = draw.searchsorted(&cdf, false, true, "right", None::<Tensor>);
        let _ = lp.gather(1, &t, false);
    }
    println!("sampler {:.3} ms/step", s.elapsed().as_secs_f64() * 1e3 / 128.0);
}
