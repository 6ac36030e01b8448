//! The standard `string_count` reward as a WebAssembly component (logic in `smallrl-standard-plugins`).
smallrl_plugin_sdk::export_reward!(smallrl_standard_plugins::StringCount);
