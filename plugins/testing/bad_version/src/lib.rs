//! A reward plugin built against `smallrl:reward@0.7.0`, a version this host does not speak:
//! the host must reject it at load with a message naming the versions.
wit_bindgen::generate!({
    inline: "
        package smallrl:reward@0.7.0;
        interface plugin { configure: func(params-json: string) -> result<_, string>; }
        interface scorer { score: func(batch: list<string>) -> result<list<f64>, string>; }
        world reward { export plugin; export scorer; }
    ",
    world: "reward",
});

struct FutureReward;

impl exports::smallrl::reward::plugin::Guest for FutureReward {
    fn configure(_params_json: String) -> Result<(), String> {
        Ok(())
    }
}

impl exports::smallrl::reward::scorer::Guest for FutureReward {
    fn score(batch: Vec<String>) -> Result<Vec<f64>, String> {
        Ok(vec![1.0; batch.len()])
    }
}

export!(FutureReward);
