//! The standard `happy_any` detector as a WebAssembly component (logic in `smallrl-standard-plugins`).
smallrl_plugin_sdk::export_detector!(smallrl_standard_plugins::HappyAny);
