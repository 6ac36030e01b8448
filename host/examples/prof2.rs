use std::time::Instant;
use tch::{Device, Kind, Tensor};
fn t<F: FnMut()>(name: &str, n: usize, mut f: F) { for _ in 0..10 { f(); } let s = Instant::now(); for _ in 0..n { f(); } println!("{name}: {:.4} ms", s.elapsed().as_secs_f64()*1e3/n as f64); }
fn main() {
    tch::set_num_threads(1);
    let _g = tch::no_grad_guard();
    let (b, kv, g, hd, cap) = (32i64, 2i64, 2i64, 32i64, 136i64);
    let f = (Kind::Float, Device::Cpu);
    let q = Tensor::randn([b, 1, kv * g, hd], f);
    let k = Tensor::randn([b, kv, cap, hd], f);
    let v = Tensor::randn([b, kv, cap, hd], f);
    let mask = Tensor::ones([b, 1, 1, cap], (Kind::Bool, Device::Cpu));
    let bias = Tensor::zeros([b, 1, 1, cap], f);
    let qt = q.transpose(1, 2);
    t("sdpa gqa", 300, || { let _ = Tensor::scaled_dot_product_attention(&qt, &k, &v, Some(&mask), 0.0, false, None, true); });
    t("bmm attn", 300, || {
        let qg = q.reshape([b * kv, g, hd]);
        let s = qg.bmm(&k.view([b * kv, cap, hd]).transpose(1, 2)).view([b, kv, g, cap]) + &bias;
        let p = s.softmax(-1, Kind::Float).view([b * kv, g, cap]);
        let _ = p.bmm(&v.view([b * kv, cap, hd])).view([b, kv * g * hd]);
    });
    t("einsum-free broadcast attn", 300, || {
        let qg = q.reshape([b, kv, g, 1, hd]);
        let s = (&qg * k.unsqueeze(2)).sum_dim_intlist(-1, false, Kind::Float) + bias.view([b, 1, 1, cap]);
        let p = s.softmax(-1, Kind::Float);
        let _ = (p.unsqueeze(-1) * v.unsqueeze(2)).sum_dim_intlist(-2, false, Kind::Float);
    });
    let h = Tensor::randn([b, 128], f);
    let w = Tensor::randn([4096, 128], f);
    let wt = w.tr().contiguous();
    t("head h@Wt(contig)", 200, || { let _ = h.matmul(&wt); });
    t("head h@W.t()", 200, || { let _ = h.matmul(&w.tr()); });
    t("head (W@h^T).t()", 200, || { let _ = w.matmul(&h.tr()).tr(); });
    t("head linear", 200, || { let _ = h.linear(&w, None::<Tensor>); });
    let x = Tensor::randn([b, 128], f);
    let wq = Tensor::randn([448, 128], f);
    let wqt = wq.tr().contiguous();
    t("qkv x@Wt", 300, || { let _ = x.matmul(&wqt); });
    t("qkv linear", 300, || { let _ = x.linear(&wq, None::<Tensor>); });
    t("qkv (W@x^T)", 300, || { let _ = wq.matmul(&x.tr()); });
    let x3 = Tensor::randn([b, 1, 128], f);
    t("qkv 3d x@Wt", 300, || { let _ = x3.matmul(&wqt); });
}
