trl grpo --config grpo_config.yaml
