MODEL=deepseek_v3 CONFIG=deepseek_v3_16b ./run_train.sh
