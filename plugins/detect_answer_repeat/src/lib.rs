//! The `answer_repeat` detector of the asked_word environment as a WebAssembly component (logic in `smallrl-standard-plugins`).
smallrl_plugin_sdk::export_detector!(smallrl_standard_plugins::AnswerRepeat);
