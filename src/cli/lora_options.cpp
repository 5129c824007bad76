#include "cli/lora_options.h"

namespace g4::cli {

void add_lora_options(VerbCli& cli) {
  add_load_options(cli);
  cli.group("Data and output");
  cli.value("--data", "directory with train.jsonl and valid.jsonl (and test.jsonl); required")->type_name("DIR");
  cli.value("--adapter-path", "where the adapter is written", "adapters")->type_name("DIR");
  cli.value("--resume-adapter-file", "start from these adapter weights")->type_name("F");
  cli.flag("--resume", "continue training the adapter already in --adapter-path (its rank, scale and layers)");
  cli.flag("--overwrite", "replace an adapter already in --adapter-path (otherwise it is refused)");
  cli.value("--log-file", "also write every report as a JSON line")->type_name("F.jsonl");
  add_chat_template_option(cli);
  cli.value("--enable-thinking", "enable_thinking for chat records (default: on for Gemma 4 tokenizers)")
      ->type_name("on|off")->check(one_of({"on", "off"}));
  cli.flag("--mask-prompt", "train on completions only (prompt/completion and chat records)");
  cli.group("Training");
  cli.value("--fine-tune-type", "only lora (mlx-lm's dora and full are not supported)", "lora")->type_name("TYPE");
  cli.value("--iters", "training iterations", "1000")->type_name("N");
  cli.value("--batch-size", "records per batch", "4")->type_name("N");
  cli.value("--learning-rate", "optimizer learning rate", "1e-5")->type_name("LR");
  cli.value("--optimizer", "adam, adamw or sgd", "adam")->type_name("NAME");
  cli.value("--num-layers", "layers that get adapters, counted from the top; -1: all", "16")->type_name("N");
  cli.value("--rank", "LoRA rank", "8")->type_name("R");
  cli.value("--scale", "LoRA scale", "20")->type_name("S");
  cli.value("--dropout", "LoRA dropout", "0")->type_name("P");
  cli.value("--max-seq-length", "longest record in tokens (longer ones are cut)", "2048")->type_name("N");
  cli.value("--grad-accumulation-steps", "batches per optimizer step", "1")->type_name("N");
  cli.value("--dtype", "with --backend cuda: the products' operands, f32 (default) or bf16 (rounded to bf16 "
            "on the tensor cores, f32 sums; activations, adapters and optimizer stay f32); host backends: f32")
      ->type_name("f32|bf16")->check(one_of({"f32", "bf16"}));
  cli.value("--seed", "seed of the batch order and the adapter's start", "0")->type_name("S");
  cli.flag("--train", "mlx_lm.lora's switch (this verb always trains)");
  cli.flag("--grad-checkpoint", "mlx_lm.lora's switch (always done here)");
  cli.group("Reports and evaluation");
  cli.value("--steps-per-report", "iterations per train-loss report", "10")->type_name("N");
  cli.value("--steps-per-eval", "iterations per validation", "200")->type_name("N");
  cli.value("--val-batches", "validation batches; -1: the whole set", "25")->type_name("N");
  cli.value("--save-every", "iterations per adapter checkpoint", "100")->type_name("N");
  cli.flag("--test", "evaluate on test.jsonl after training");
  cli.value("--test-batches", "test batches; -1: the whole set", "500")->type_name("N");
  cli.group("Options");
}

}  // namespace g4::cli
