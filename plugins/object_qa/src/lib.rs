//! The `object_qa` environment as a WebAssembly component (logic in `smallrl-qa-environments`).
smallrl_plugin_sdk::export_environment!(smallrl_qa_environments::ObjectQa);
