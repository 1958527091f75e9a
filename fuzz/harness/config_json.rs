//! Harness: arbitrary bytes as a Hugging Face `config.json`. Whatever the parser accepts must
//! give a config whose derived counts and lists are bounded by the arithmetic, not by the
//! counts it claims (a hostile layer count once built a list per layer until memory ran out).
//! Shared by the cargo-fuzz target and the stable test that runs the seeds and their mutations.

pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(hf) = tlaloc_export::HfConfig::from_json(text) else {
        return;
    };
    let Ok(config) = hf.into_config() else {
        return;
    };
    let _ = config.to_string();
    let count = tlaloc_export::TensorRole::required_count(&config);
    // The lazy list yields what the count says, and the first few cost nothing.
    let first: Vec<_> = tlaloc_export::TensorRole::required_roles(&config)
        .take(64)
        .collect();
    assert_eq!(first.len(), count.min(64));
    for role in &first {
        assert!(role.is_required(&config), "{role} listed but not required");
        let _ = role.expected_dims(&config);
    }
}
