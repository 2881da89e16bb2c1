"""Every string the studio shows, in English and Chinese.

UI strings live in `UI`; form fields take their English help from RunSpec (one source of truth)
and their labels and Chinese help from `FIELDS`. `t()` falls back to English, and the tests check
that nothing is missing.
"""

from __future__ import annotations

from typing import Any

LANGS = ("en", "zh")
LANG_NAMES = {"en": "English", "zh": "中文"}

UI: dict[str, dict[str, str]] = {
    "title": {"en": "GRPO Studio", "zh": "GRPO Studio"},
    "subtitle": {"en": "Build a GRPO run, launch it, watch it learn.", "zh": "配置 GRPO 训练、一键启动、实时观察学习过程。"},
    "subtitle_runs": {"en": "Every run directory, live: progress, curves, samples. Runs started from the CLI appear too.",
                      "zh": "所有运行目录，实时显示进度、曲线与样本；命令行启动的运行也会出现。"},
    "subtitle_compare": {"en": "Overlay any metric of several runs.", "zh": "叠加对比多个运行的任意指标。"},
    "language": {"en": "Language / 语言", "zh": "语言 / Language"},
    "tab_build": {"en": "Build a run", "zh": "构建训练"},
    "tab_runs": {"en": "Runs", "zh": "运行"},
    "tab_compare": {"en": "Compare", "zh": "对比"},
    # presets and import
    "preset": {"en": "Preset", "zh": "预设"},
    "preset_info": {"en": "One click fills every field from presets/<name>.yaml.", "zh": "一键用 presets/<名称>.yaml 填充所有字段。"},
    "preset_loaded": {"en": "Loaded preset {name}.", "zh": "已载入预设 {name}。"},
    "preset_error": {"en": "Could not load preset {name}: {err}", "zh": "无法载入预设 {name}：{err}"},
    "import_acc": {"en": "Import from ms-swift or TRL", "zh": "从 ms-swift 或 TRL 导入"},
    "import_text": {"en": "A `swift rlhf --rlhf_type grpo …` command line, or a TRL GRPOConfig as YAML or JSON",
                    "zh": "粘贴 `swift rlhf --rlhf_type grpo …` 命令行，或 YAML/JSON 格式的 TRL GRPOConfig"},
    "import_btn": {"en": "Import into the form", "zh": "导入到表单"},
    "import_ok": {"en": "Imported {n} field(s).", "zh": "已导入 {n} 个字段。"},
    "import_unmapped": {"en": "No equivalent here, not imported:", "zh": "此处没有对应项，未导入："},
    "import_notes": {"en": "Conversions:", "zh": "换算说明："},
    "import_error": {"en": "Could not import: {err}", "zh": "无法导入：{err}"},
    "import_empty": {"en": "Paste a command line or a config first.", "zh": "请先粘贴命令行或配置。"},
    # sections
    "sec_model": {"en": "Model", "zh": "模型"},
    "sec_data": {"en": "Dataset", "zh": "数据集"},
    "sec_rewards": {"en": "Rewards", "zh": "奖励函数"},
    "sec_rollout": {"en": "Rollout", "zh": "采样 (Rollout)"},
    "sec_resources": {"en": "GPUs and resources", "zh": "GPU 与资源"},
    "sec_algorithm": {"en": "Algorithm", "zh": "算法"},
    "sec_output": {"en": "Output", "zh": "输出"},
    "advanced": {"en": "Advanced", "zh": "高级选项"},
    # model
    "model_check": {"en": "Check model", "zh": "检查模型"},
    "model_not_found": {"en": "No local model at {path} (hub ids are checked once downloaded).",
                        "zh": "本地找不到模型 {path}（Hub 模型下载后才能检查）。"},
    "model_no_config": {"en": "{path} has no config.json.", "zh": "{path} 中没有 config.json。"},
    "model_summary": {"en": "**{arch}** ({mtype}) · {params} parameters{exact} · {layers} layers · hidden {hidden} · "
                             "heads {heads}/{kv} · vocab {vocab} · context {ctx} · dtype {dtype} · chat template: {tmpl}",
                      "zh": "**{arch}**（{mtype}）· 参数量 {params}{exact} · {layers} 层 · 隐藏维度 {hidden} · "
                            "注意力头 {heads}/{kv} · 词表 {vocab} · 上下文 {ctx} · 精度 {dtype} · 对话模板：{tmpl}"},
    "exact": {"en": " (exact, from safetensors headers)", "zh": "（精确值，来自 safetensors 头）"},
    "estimate": {"en": " (estimated from config.json)", "zh": "（根据 config.json 估算）"},
    "yes": {"en": "yes", "zh": "有"},
    "no": {"en": "no", "zh": "无"},
    "multimodal": {"en": " · multimodal (vision tower not counted in estimates)", "zh": " · 多模态（估算不含视觉塔）"},
    # data
    "data_upload": {"en": "Upload a data file (JSONL, JSON, CSV, Parquet)", "zh": "上传数据文件（JSONL、JSON、CSV、Parquet）"},
    "data_uploaded": {"en": "Uploaded to {path} and added to the sources.", "zh": "已上传到 {path} 并加入数据源。"},
    "data_preview": {"en": "Preview rows as the model sees them", "zh": "预览模型实际看到的输入"},
    "data_columns": {"en": "Columns in {src}: {cols}", "zh": "{src} 中的列：{cols}"},
    "data_preview_error": {"en": "Could not preview: {err}", "zh": "无法预览：{err}"},
    "data_row": {"en": "Row {i} of {src}", "zh": "{src} 第 {i} 行"},
    "data_images": {"en": "Images of the previewed rows", "zh": "预览行中的图片"},
    # rewards
    "builtins": {"en": "Built-in rewards", "zh": "内置奖励函数"},
    "builtins_info": {"en": "Tick to add a row below; weights and params are edited in the table.",
                      "zh": "勾选即在下表添加一行；权重和参数在表格中编辑。"},
    "builtins_docs": {"en": "Built-in rewards: formulas and parameters", "zh": "内置奖励函数：公式与参数"},
    "test_source": {"en": "Completions to score", "zh": "被评分的回答"},
    "plugin_upload": {"en": "Upload a plugin file (.py)", "zh": "上传插件文件（.py）"},
    "code_editor": {"en": "Custom reward function (Python, TRL signature)", "zh": "自定义奖励函数（Python，TRL 签名）"},
    "plugin_name": {"en": "Plugin file name", "zh": "插件文件名"},
    "save_plugin": {"en": "Save as plugin and use it", "zh": "保存为插件并使用"},
    "plugin_saved": {"en": "Saved {path}; added to plugins and to the reward table ({fns}).",
                     "zh": "已保存 {path}，并加入插件列表与奖励表（{fns}）。"},
    "plugin_error": {"en": "Plugin not saved: {err}", "zh": "插件未保存：{err}"},
    "plugin_nofn": {"en": "the code defines no top-level function", "zh": "代码中没有顶层函数"},
    "test_rewards": {"en": "Test rewards on a few rows", "zh": "在几行数据上测试奖励"},
    "test_rows": {"en": "Rows to score", "zh": "测试行数"},
    "rewards_failed": {"en": "Reward test failed: {err}", "zh": "奖励测试失败：{err}"},
    "rewards_invalid": {"en": "Fix the form first: {err}", "zh": "请先修正表单：{err}"},
    "rewards_scored": {"en": "Scored {n} row(s).", "zh": "已评分 {n} 行。"},
    # GPUs
    "gpu_panel": {"en": "GPU split", "zh": "GPU 分配"},
    "gpu_none": {"en": "No GPU is visible on this machine: training and sampling run on the CPU.",
                 "zh": "本机没有可见的 GPU：训练和采样都在 CPU 上运行。"},
    "gpu_found": {"en": "Visible GPUs: {gpus}", "zh": "可见 GPU：{gpus}"},
    "use_cpu": {"en": "Use CPU (device cpu, engine hf)", "zh": "使用 CPU（device cpu，引擎 hf）"},
    "train_chips": {"en": "Training GPUs", "zh": "训练 GPU"},
    "rollout_chips": {"en": "Rollout GPUs", "zh": "采样 GPU"},
    "planner_ok": {"en": "Planner: OK", "zh": "规划：可行"},
    "planner_bad": {"en": "Planner: not runnable", "zh": "规划：不可运行"},
    # actions
    "start": {"en": "Start", "zh": "开始训练"},
    "preview_cmd": {"en": "Preview command", "zh": "预览命令"},
    "command": {"en": "Equivalent command line", "zh": "等价命令行"},
    "save_preset": {"en": "Save as preset", "zh": "保存为预设"},
    "preset_name": {"en": "Preset name", "zh": "预设名称"},
    "overwrite": {"en": "Overwrite", "zh": "覆盖"},
    "preset_saved": {"en": "Saved preset {name}.", "zh": "已保存预设 {name}。"},
    "preset_exists": {"en": "Preset {name} exists: tick Overwrite to replace it.", "zh": "预设 {name} 已存在：勾选“覆盖”以替换。"},
    "export_yaml": {"en": "Export YAML", "zh": "导出 YAML"},
    "yaml_file": {"en": "RunSpec YAML", "zh": "RunSpec YAML"},
    "valid": {"en": "✓ Ready to start.", "zh": "✓ 可以开始。"},
    "invalid": {"en": "Fix {n} problem(s) before starting:", "zh": "开始前需修正 {n} 个问题："},
    "started": {"en": "Started {run}.", "zh": "已启动 {run}。"},
    "start_failed": {"en": "Could not start: {err}", "zh": "无法启动：{err}"},
    "invalid_form": {"en": "The form has problems; see the messages next to the fields.", "zh": "表单有问题，请查看字段旁的提示。"},
    # runs
    "runs_table": {"en": "Runs (refresh by themselves; CLI runs appear too)", "zh": "运行列表（自动刷新；命令行启动的运行也会出现）"},
    "run_select": {"en": "Run", "zh": "运行"},
    "stop": {"en": "Stop", "zh": "停止"},
    "force_kill": {"en": "Force kill", "zh": "强制结束"},
    "resume": {"en": "Resume", "zh": "继续训练"},
    "clone": {"en": "Clone into form", "zh": "复制到表单"},
    "delete": {"en": "Delete", "zh": "删除"},
    "confirm_delete": {"en": "Confirm: delete {run}", "zh": "确认删除 {run}"},
    "cancel": {"en": "Cancel", "zh": "取消"},
    "no_run": {"en": "No run selected.", "zh": "未选择运行。"},
    "stopping": {"en": "Stopping {run}: it saves a checkpoint, then exits. Click again to kill it now.",
                 "zh": "正在停止 {run}：保存检查点后退出。再次点击可立即强制结束。"},
    "killed": {"en": "Killed {run} and its process group.", "zh": "已强制结束 {run} 及其进程组。"},
    "not_running": {"en": "{run} is not running.", "zh": "{run} 未在运行。"},
    "resumed": {"en": "Resuming {run}.", "zh": "正在继续 {run}。"},
    "resume_failed": {"en": "Could not resume: {err}", "zh": "无法继续：{err}"},
    "cloned": {"en": "Copied {run}'s spec into the form.", "zh": "已将 {run} 的配置复制到表单。"},
    "clone_failed": {"en": "Could not clone: {err}", "zh": "无法复制：{err}"},
    "deleted": {"en": "Deleted {run}.", "zh": "已删除 {run}。"},
    "delete_active": {"en": "{run} is still active: stop it first.", "zh": "{run} 仍在运行：请先停止。"},
    "delete_refused": {"en": "Refused: {run} is not a run directory inside the runs folder.",
                       "zh": "拒绝：{run} 不是运行目录中的运行。"},
    "no_runs": {"en": "No runs yet: build one in the first tab and press Start.", "zh": "还没有运行：在第一个标签页配置后点击“开始训练”。"},
    "progress_step": {"en": "step", "zh": "步"},
    "elapsed": {"en": "elapsed", "zh": "已用"},
    "eta": {"en": "ETA", "zh": "剩余"},
    "per_step": {"en": "s/step", "zh": "秒/步"},
    "tok_s": {"en": "tokens/s", "zh": "token/秒"},
    "run_failed": {"en": "Run failed", "zh": "运行失败"},
    "log_tail": {"en": "Log (tail of train.log)", "zh": "日志（train.log 末尾）"},
    "dashboard": {"en": "Live dashboard", "zh": "实时看板"},
    "more_charts": {"en": "More charts: loss and learning rate, timing, throughput, telemetry, evaluation",
                    "zh": "更多图表：损失与学习率、耗时、吞吐、系统、评估"},
    "smoothing": {"en": "Smoothing", "zh": "平滑"},
    "x_axis": {"en": "x axis", "zh": "横轴"},
    "x_step": {"en": "step", "zh": "步数"},
    "x_elapsed": {"en": "elapsed hours", "zh": "已用小时"},
    "x_wall": {"en": "wall time", "zh": "时钟时间"},
    "no_data": {"en": "no data yet", "zh": "暂无数据"},
    "no_samples": {"en": "no samples yet", "zh": "暂无样本"},
    "chart_reward": {"en": "Reward (mean ± std) and each function's mean", "zh": "奖励（均值 ± 标准差）及各函数均值"},
    "chart_reward_spread": {"en": "reward_std and frac_reward_zero_std", "zh": "奖励标准差与零方差组比例"},
    "chart_lengths": {"en": "Completion length (mean/min/max) and clipped ratio", "zh": "生成长度（均值/最小/最大）与截断比例"},
    "chart_policy": {"en": "KL, entropy, clipped and masked ratios", "zh": "KL、熵、裁剪与屏蔽比例"},
    "chart_optim": {"en": "Loss, grad norm, learning rate", "zh": "损失、梯度范数、学习率"},
    "chart_timing": {"en": "Seconds per step (rollout / reward / train / weight sync)", "zh": "每步耗时（采样/奖励/训练/权重同步）"},
    "chart_throughput": {"en": "Completion tokens per second, staleness", "zh": "每秒生成 token 数、策略滞后"},
    "chart_telemetry": {"en": "Telemetry: RAM, CPU, GPU", "zh": "系统：内存、CPU、GPU"},
    "chart_eval": {"en": "Evaluation", "zh": "评估"},
    "chart_hist": {"en": "Reward distribution: first, chosen and latest step", "zh": "奖励分布：首步、所选步与最新步"},
    "hist_first": {"en": "first (step {s})", "zh": "首步（{s}）"},
    "hist_chosen": {"en": "chosen (step {s})", "zh": "所选（{s}）"},
    "hist_latest": {"en": "latest (step {s})", "zh": "最新（{s}）"},
    "samples": {"en": "Samples", "zh": "样本"},
    "sample_step": {"en": "Step", "zh": "步"},
    "follow_latest": {"en": "Follow the latest step", "zh": "跟随最新步"},
    "reward_min": {"en": "Reward ≥", "zh": "奖励 ≥"},
    "reward_max": {"en": "Reward ≤", "zh": "奖励 ≤"},
    "text_filter": {"en": "Text contains", "zh": "包含文字"},
    "samples_none": {"en": "No samples match.", "zh": "没有匹配的样本。"},
    "s_prompt": {"en": "prompt", "zh": "提示"},
    "s_solution": {"en": "solution", "zh": "参考答案"},
    "s_completion": {"en": "completion", "zh": "生成"},
    "s_reward": {"en": "reward", "zh": "奖励"},
    "s_adv": {"en": "adv", "zh": "优势"},
    "s_len": {"en": "len", "zh": "长度"},
    "s_group": {"en": "group", "zh": "组"},
    "s_best": {"en": "best in group", "zh": "组内最佳"},
    "s_worst": {"en": "worst in group", "zh": "组内最差"},
    # compare
    "compare_runs": {"en": "Runs to compare", "zh": "要对比的运行"},
    "compare_metric": {"en": "Metric", "zh": "指标"},
    "compare_title": {"en": "{metric} across runs", "zh": "各运行的 {metric}"},
    # runs table
    "col_run": {"en": "run", "zh": "运行"},
    "col_preset": {"en": "preset", "zh": "预设"},
    "col_state": {"en": "state", "zh": "状态"},
    "col_step": {"en": "step", "zh": "步数"},
    "col_reward": {"en": "reward", "zh": "奖励"},
    "col_started": {"en": "started", "zh": "开始时间"},
    "col_duration": {"en": "duration", "zh": "时长"},
    "st_starting": {"en": "starting", "zh": "启动中"},
    "run_warnings": {"en": "This run needs attention", "zh": "此运行需要注意"},
    "st_running": {"en": "running", "zh": "运行中"},
    "st_stopping": {"en": "stopping", "zh": "停止中"},
    "st_stopped": {"en": "stopped", "zh": "已停止"},
    "st_finished": {"en": "finished", "zh": "已完成"},
    "st_failed": {"en": "failed", "zh": "失败"},
    "st_unknown": {"en": "unknown", "zh": "未知"},
    # paths
    "outside": {"en": "{path} is outside the workspace.", "zh": "{path} 不在工作区内。"},
}

# 'section.field' -> (English label, Chinese label, Chinese help). English help comes from RunSpec.
FIELDS: dict[str, tuple[str, str, str]] = {
    "model.name_or_path": ("Model (path or hub id)", "模型（路径或 Hub ID）", "本地模型目录或 Hub ID（组织/名称）。"),
    "model.finetune": ("Fine-tuning", "微调方式", "训练全部权重，或训练 LoRA 适配器（peft）。"),
    "model.lora_rank": ("LoRA rank", "LoRA 秩", "LoRA 的秩 r。"),
    "model.lora_alpha": ("LoRA alpha", "LoRA alpha", "LoRA alpha（缩放 = alpha / r）。"),
    "model.lora_dropout": ("LoRA dropout", "LoRA dropout", "LoRA 分支上的 dropout。"),
    "model.lora_targets": ("LoRA target modules", "LoRA 目标模块", "LoRA 包装的模块名；'all-linear' = 除输出头外的所有线性层。"),
    "model.dtype": ("dtype", "数据类型", "权重与计算的精度。CPU 上用 float32（此处无原生 bf16）。"),
    "model.gradient_checkpointing": ("Gradient checkpointing", "梯度检查点", "反向传播时重新计算激活以节省显存。"),
    "model.trust_remote_code": ("Trust remote code", "信任远程代码", "允许运行模型目录中的代码。"),
    "data.sources": ("Training data", "训练数据",
                     "训练数据：JSONL、JSON、CSV 或 Parquet 文件，已保存的 datasets 目录或 Hub 数据集 ID，"
                     "可带样本数（'train.jsonl#1800'）；按随机种子混合。"),
    "data.prompt_column": ("Prompt column", "提示列", "提示所在的列：字符串或对话消息列表。"),
    "data.solution_column": ("Solution column", "答案列", "参考答案所在的列，以 'solution' 传给奖励函数。"),
    "data.images_column": ("Images column", "图片列", "多模态模型的图片路径列（'' = 无）。"),
    "data.prompt_template": ("Prompt template", "提示模板",
                             "用列拼出提示，例如 'Make {target} from {nums}.'（'' = 使用提示列）。"),
    "data.system_prompt": ("System prompt", "系统提示", "加在每个提示前的系统消息（'' = 无）。"),
    "data.chat_template": ("Chat template", "对话模板", "是否应用分词器的对话模板：auto = 分词器有模板时应用。"),
    "data.limit": ("Row limit", "行数上限", "混合后最多使用这么多训练行（0 = 全部）。"),
    "data.eval_sources": ("Evaluation data", "评估数据", "用于评估的留出数据，格式同训练数据。"),
    "rewards.functions": ("Reward functions", "奖励函数", "奖励函数，按权重加总。"),
    "rewards.plugins": ("Plugin files", "插件文件", "其中的奖励函数可在上表按名称使用的 Python 文件。"),
    "rewards.on_error": ("On reward error", "奖励出错时", "奖励函数报错或超时时：让训练失败，或将该批次记为 None。"),
    "rewards.timeout_s": ("Reward timeout (s)", "奖励超时（秒）", "单个奖励函数每批次的超时时间（秒）。"),
    "rollout.engine": ("Engine", "推理引擎", "采样引擎：hf（transformers，CPU 或 GPU）、vllm、lmdeploy（GPU）。"),
    "rollout.placement": ("Placement", "部署方式",
                          "colocate：引擎与训练共用设备（训练时休眠）；separate：引擎运行在独立的采样 GPU 上。"),
    "rollout.num_generations": ("Generations per prompt (G)", "每个提示的生成数（G）", "每个提示生成的回答数（组大小 G）。"),
    "rollout.temperature": ("Temperature", "温度", "采样温度。"),
    "rollout.top_p": ("top_p", "top_p", "核采样：保留累计概率达到该值的最小 token 集合。"),
    "rollout.top_k": ("top_k", "top_k", "只保留概率最高的 k 个 token（0 = 关闭）。"),
    "rollout.max_completion_length": ("Max completion tokens", "最大生成长度", "每个回答最多生成的 token 数。"),
    "rollout.async_generation": ("Async generation", "异步生成",
        "训练本批时用引擎已有的最新权重提前采样后续批次（最"
        "多偏离策略 max_staleness 次更新）。"),
    "rollout.gpu_memory_utilization": ("GPU memory fraction", "显存占用比例", "引擎可占用的显存比例。"),
    "rollout.tensor_parallel_size": ("Tensor parallel size", "张量并行数", "每个引擎实例使用的 GPU 数（张量并行）。"),
    "rollout.data_parallel_size": ("Engine instances (DP)", "引擎实例数（数据并行）", "并行采样的引擎实例数。"),
    "rollout.sleep": ("Sleep while training", "训练时休眠", "共置的引擎在训练更新期间释放显存。"),
    "rollout.lmdeploy_backend": ("LMDeploy backend", "LMDeploy 后端", "LMDeploy 引擎后端。"),
    "rollout.max_staleness": ("Max staleness", "最大陈旧度", "异步时，采样一批到用它训练之间最多相隔的策略更新次数（1 = 偏离策略一步）。"),
    "rollout.worker_urls": ("Worker URLs", "采样进程地址",
        "手动启动的采样进程的 host:port（python -m backend.rollou"
        "t.worker）；空 = 由训练器启动。密钥取自 GRPO_WORKER_AUTHKEY。"),
    "rollout.worker_python": ("Worker Python", "采样进程 Python",
        "采样进程使用的 Python 解释器，例如 LMDeploy 或"
        " vLLM 环境的 bin/python（空 = 与训练器相同）。"),
    "rollout.worker_threads": ("Worker threads", "采样进程线程数", "CPU 上每个采样进程的 torch 线程数。"),
    "rollout.worker_timeout_s": ("Worker timeout (s)", "采样进程超时（秒）",
        "采样进程单次请求超过此时间即视为"
        "卡死：运行失败并给出该进程的名字。"),
    "rollout.vllm_importance_sampling_correction": ("Importance sampling correction", "重要性采样校正",
        "截断重要性采样：按 训练策略/采样策略 的概率比加权损失，校正引"
        "擎与训练器的差异和异步陈旧度（TRL 的名字，适用于所有引擎）。"),
    "rollout.vllm_importance_sampling_mode": ("Importance sampling mode", "重要性采样方式",
        "按 token 或按序列计算比值；truncat"
        "e = 在上限处截断，mask = 超过上限置零。"),
    "rollout.vllm_importance_sampling_clip_max": ("Importance sampling cap", "重要性采样上限", "重要性采样比值的上限 C。"),
    "resources.device": ("Device", "设备", "训练设备；auto = 有 CUDA 就用 GPU，否则用 CPU。"),
    "resources.train_gpus": ("Training GPUs", "训练 GPU", "用于训练的 GPU 编号（空 = 全部可见 GPU，或 CPU）。"),
    "resources.rollout_gpus": ("Rollout GPUs", "采样 GPU", "placement 为 separate 时采样引擎使用的 GPU 编号。"),
    "resources.deepspeed_stage": ("DeepSpeed ZeRO stage", "DeepSpeed ZeRO 阶段", "DeepSpeed ZeRO 阶段（0 = 纯 PyTorch）。"),
    "resources.offload": ("Offload optimizer", "优化器卸载", "将优化器状态卸载到 CPU（DeepSpeed）。"),
    "resources.num_threads": ("CPU threads", "CPU 线程数", "torch 使用的 CPU 线程数（0 = torch 默认）。"),
    "algorithm.loss_type": ("Loss type", "损失类型",
                            "目标与聚合方式：grpo = 先按序列平均再跨序列平均；bnpo = 对微批次全部 token 平均；"
                            "dr_grpo = token 求和 / (序列数 × 最大生成长度)；dapo = 对整个累积批次的 token 平均；"
                            "cispo = 截断并停止梯度的重要性权重 × 优势 × 对数概率，按批次 token 平均（MiniMax-M1，上限为 "
                            "epsilon_high）；sapo = 用平滑的 sigmoid 门控代替硬裁剪（SAPO）；luspo = 每个序列 token 求和"
                            "后跨序列平均，配合序列级重要性采样（LUSPO）。"),
    "algorithm.beta": ("KL coefficient (beta)", "KL 系数（beta）", "相对参考模型的 KL 系数（0 = 不加载参考模型）。"),
    "algorithm.use_bias_correction_kl": ("Bias-corrected KL", "KL 偏差校正",
                                         "将 k3 KL 项乘以重要性比率，得到无偏的反向 KL 梯度（DeepSeek-V3.2）；仅在 beta > 0 时有效。"),
    "algorithm.epsilon": ("Clip epsilon", "裁剪 epsilon", "比率的下裁剪范围：1 - epsilon。"),
    "algorithm.epsilon_high": ("Clip epsilon high", "上裁剪 epsilon_high",
                               "上裁剪范围：1 + epsilon_high（0 = 与 epsilon 相同；DAPO 用 0.28）。"
                               "loss_type 为 cispo 时它就是重要性权重的上限本身（ScaleRL：5.0）。"),
    "algorithm.delta": ("Two-sided clip (delta)", "双侧裁剪（delta）",
                        "双侧裁剪（INTELLECT-2）：把未裁剪的比率项限制在 delta 以内，须大于 1 + epsilon_high，例如 4（0 = 关闭）。"),
    "algorithm.sapo_temperature_pos": ("SAPO temperature (A > 0)", "SAPO 温度（正优势）", "正优势 token 的 SAPO 门控温度。"),
    "algorithm.sapo_temperature_neg": ("SAPO temperature (A <= 0)", "SAPO 温度（非正优势）",
                                       "非正优势 token 的 SAPO 门控温度（论文建议略高于正优势温度）。"),
    "algorithm.num_iterations": ("Updates per batch (mu)", "每批更新次数（mu）", "每个采样批次做的优化步数（论文中的 mu）。"),
    "algorithm.scale_rewards": ("Scale rewards", "奖励缩放", "用组内、批内奖励标准差归一化优势，或不归一化（Dr. GRPO）。"),
    "algorithm.importance_sampling_level": ("Importance sampling level", "重要性采样粒度",
                                            "按 token 计算比率（GRPO），或每个序列一个比率，即平均对数比（GSPO）。"),
    "algorithm.mask_truncated_completions": ("Mask truncated completions", "屏蔽被截断的回答", "将达到最大长度的回答排除在损失之外。"),
    "algorithm.off_policy_mask_threshold": ("Off-policy mask threshold", "离策略序列屏蔽阈值",
                                            "离策略序列屏蔽（DeepSeek-V3.2）：优势为负且与采样策略的平均逐 token "
                                            "log 概率差超过该值的回答不参与损失；有引擎采样对数概率时用之，例如 0.5（0 = 关闭）。"),
    "algorithm.top_entropy_quantile": ("Top-entropy token fraction", "高熵 token 比例",
                                       "只在熵最高的这部分 token（分叉 token）上训练（80/20 规则：0.2；1 = 全部 token）。"),
    "algorithm.entropy_coef": ("Entropy bonus", "熵奖励系数",
                               "熵奖励：从损失中减去 系数 × 平均 token 熵，对所有损失类型含义相同（0 = 关闭；自适应时为初始值）。"),
    "algorithm.use_adaptive_entropy": ("Adaptive entropy control", "自适应熵控制",
                                       "自适应熵控制（Skywork-OR1）：仅当熵不高于 entropy_target 时施加熵奖励；"
                                       "每步熵不高于目标则系数加 entropy_coef_delta，否则减小。"),
    "algorithm.entropy_target": ("Entropy target", "目标熵", "自适应熵控制的目标平均 token 熵（nats），可设为训练初期记录的熵附近。"),
    "algorithm.entropy_coef_min": ("Entropy coef min", "熵系数下限", "自适应熵系数的下限。"),
    "algorithm.entropy_coef_max": ("Entropy coef max", "熵系数上限", "自适应熵系数的上限。"),
    "algorithm.entropy_coef_delta": ("Entropy coef step", "熵系数步长", "每个优化步自适应熵系数的调整量。"),
    "algorithm.disable_dropout": ("Disable dropout", "关闭 dropout",
                                  "关闭策略与参考模型中的 dropout，使首次更新时与采样策略的比率恰为 1，参考模型输出确定。"),
    "algorithm.dynamic_sampling": ("Dynamic sampling", "动态采样", "丢弃奖励全相同的组并补采更多提示（DAPO）。"),
    "algorithm.dynamic_sampling_max_retries": ("Dynamic sampling retries", "动态采样重试次数", "为补满批次而额外采样的轮数。"),
    "algorithm.learning_rate": ("Learning rate", "学习率", "峰值学习率（AdamW）。"),
    "algorithm.lr_scheduler": ("LR schedule", "学习率调度", "预热之后的学习率调度方式。"),
    "algorithm.warmup_steps": ("Warmup steps", "预热步数", "线性预热的步数。"),
    "algorithm.weight_decay": ("Weight decay", "权重衰减", "AdamW 权重衰减。"),
    "algorithm.max_grad_norm": ("Max grad norm", "最大梯度范数", "梯度裁剪范数（0 = 关闭）。"),
    "algorithm.prompts_per_step": ("Prompts per step", "每步提示数", "每个优化步使用的提示数；每个提示生成 num_generations 个回答。"),
    "algorithm.gradient_accumulation_steps": ("Gradient accumulation", "梯度累积", "每个优化步的微批次数。"),
    "algorithm.max_steps": ("Max steps", "最大步数", "训练的优化步数。"),
    "algorithm.seed": ("Seed", "随机种子", "数据顺序、采样和初始化的随机种子。"),
    "output.runs_dir": ("Runs folder", "运行目录", "存放运行目录的文件夹。"),
    "output.run_name": ("Run name", "运行名称", "运行 ID 中的名称（'' = 取自预设或模型）。"),
    "output.save_steps": ("Save every N steps", "每 N 步保存", "每 N 步保存一次检查点（0 = 仅在结束时）。"),
    "output.save_total_limit": ("Checkpoints to keep", "保留检查点数", "只保留最新的 N 个检查点（0 = 全部保留）。"),
    "output.log_samples_steps": ("Log samples every N steps", "每 N 步记录样本", "每 N 步记录全部生成结果（0 = 从不）。"),
    "output.eval_steps": ("Evaluate every N steps", "每 N 步评估", "每 N 步在评估数据上评估（0 = 从不）。"),
    "output.report_to": ("Also report to", "同时上报到", "除 metrics.jsonl 外的指标记录目标。"),
}


def t(key: str, lang: str = "en", **fmt: Any) -> str:
    entry = UI.get(key)
    text = key if entry is None else entry.get(lang) or entry["en"]
    return text.format(**fmt) if fmt else text


def field_label(path: str, lang: str = "en") -> str:
    entry = FIELDS.get(path)
    if entry is None:  # a field added to RunSpec before it got a label here: still shown, by its name
        return path.split(".")[1].replace("_", " ")
    return entry[1] if lang == "zh" else entry[0]


def field_help(path: str, default_help: str, lang: str = "en") -> str:
    """Help text, with the option's name so users of TRL/ms-swift recognise it."""
    entry = FIELDS.get(path)
    text = entry[2] if (lang == "zh" and entry) else default_help
    return f"{text} [{path}]"


def state_label(state: str, lang: str = "en") -> str:
    return t(f"st_{state}", lang) if f"st_{state}" in UI else state
