//! `lattice chat`: an interactive conversation on stdin/stdout with the model's chat template.
//! Replies stream as they are generated; the KV cache of the conversation so far is reused
//! between turns. Commands: `/reset` starts over, `/exit` (or end of input) quits. Images
//! (`--image`, vision-language models) go into the first user message, before its text.

use std::io::{BufRead, Write};

use lattice_inference::chat::{ChatMessage, RenderOptions};
use lattice_inference::engine::{generate_in, GenerateRequest, Session};

use super::generate::{
    read_images, report_speed, user_message, ConstraintArgs, ModelArgs, SamplingArgs,
    SpeculativeArgs,
};

/// Arguments of `lattice chat`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// A system message to start the conversation with.
    #[arg(long)]
    system: Option<String>,
    /// Most tokens per reply.
    #[arg(long, default_value_t = 1024)]
    max_tokens: usize,
    /// Turn the model's thinking on or off (templates with an `enable_thinking` switch).
    #[arg(long)]
    thinking: Option<bool>,
    /// Context size in tokens (default: the model's, at most 8192).
    #[arg(long)]
    context: Option<usize>,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    constraint: ConstraintArgs,
    #[command(flatten)]
    speculative: SpeculativeArgs,
    /// An image for a vision-language model (repeatable): part of the first user message.
    #[arg(long)]
    image: Vec<std::path::PathBuf>,
}

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<()> {
    args.sampling.params().validate()?;
    let model = args.model.load()?;
    let images = read_images(&model, &args.image)?;
    let constraint = args.constraint.compile(&model)?;
    args.speculative.check(&model)?;
    if model.chat_template.is_none() {
        anyhow::bail!(
            "`{}` has no chat template; use `lattice generate --prompt` instead",
            args.model.model.display()
        );
    }
    let context = args
        .context
        .unwrap_or(8192)
        .min(model.decoder.info().config.max_positions);
    let start = || -> Vec<ChatMessage> {
        args.system
            .iter()
            .map(|s| ChatMessage::new("system", s))
            .collect()
    };
    let mut messages = start();
    let mut session = Session::new(&model, context);
    let opts = RenderOptions {
        add_generation_prompt: true,
        enable_thinking: args.thinking,
        ..Default::default()
    };
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let stdout = std::io::stdout();
    loop {
        eprint!("> ");
        let Some(line) = lines.next() else { break };
        let line = line?;
        let text = line.trim();
        match text {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                messages = start();
                session = Session::new(&model, context);
                eprintln!("(conversation reset)");
                continue;
            }
            _ => {}
        }
        // The images belong to the first user message of the conversation.
        let first = !messages.iter().any(|m| m.role == "user");
        let shown = if first { images.len() } else { 0 };
        messages.push(user_message(text, shown));
        let sent = if messages.iter().any(|m| !m.parts.is_empty()) {
            images.clone()
        } else {
            Vec::new()
        };
        let encoded = model
            .encode_chat(&messages, &opts)
            .and_then(|ids| model.expand_images(ids, &sent));
        let prompt_ids = match encoded {
            Ok(ids) => ids,
            Err(e) => {
                messages.pop();
                eprintln!("error: {e}");
                continue;
            }
        };
        let budget = context.saturating_sub(prompt_ids.len());
        let mut req = GenerateRequest::new(
            prompt_ids,
            args.max_tokens.min(budget),
            args.sampling.params(),
        );
        req.constraint = constraint.clone();
        req.images = sent;
        args.speculative.apply(&mut req);
        let mut out = stdout.lock();
        let result = generate_in(&model, &req, &mut session, &mut |piece| {
            out.write_all(piece.as_bytes())
                .and_then(|_| out.flush())
                .is_ok()
        });
        writeln!(out)?;
        match result {
            Ok(g) => {
                report_speed(&g);
                messages.push(ChatMessage::new("assistant", g.text.trim()));
            }
            Err(e) => {
                messages.pop();
                eprintln!("error: {e} (use /reset to start over)");
            }
        }
    }
    Ok(())
}
