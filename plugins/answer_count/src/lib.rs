//! The `answer_count` reward of the asked_word environment as a WebAssembly component (logic in `smallrl-standard-plugins`).
smallrl_plugin_sdk::export_reward!(smallrl_standard_plugins::AnswerCount);
