# GPT-3 175B on 1,024 A100s as Megatron-LM's SC'21 scripts launch it (Narayanan et al. 2021,
# Table 1): tp 8, pp 8 with interleaving (4 layers per virtual stage), batch 1536.
torchrun --nproc_per_node 8 --nnodes 128 pretrain_gpt.py \
  --tensor-model-parallel-size 8 --pipeline-model-parallel-size 8 \
  --num-layers-per-virtual-pipeline-stage 4 \
  --num-layers 96 --hidden-size 12288 --num-attention-heads 96 \
  --seq-length 2048 --max-position-embeddings 2048 --vocab-size 51200 \
  --micro-batch-size 1 --global-batch-size 1536 \
  --fp16 --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather \
  --lr 6e-5 --min-lr 6e-6 --lr-decay-style cosine --train-iters 500000 \
  --data-path /data/pile_text_document --split 949,50,1 --clip-grad 1.0 --weight-decay 0.1
