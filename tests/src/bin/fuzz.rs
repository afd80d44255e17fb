//! `cargo xtask fuzz --frames N [--seed S]`: a long parser-fuzzing campaign
//! through the real kernel (`limiter_tests::fuzz`): prints the seed, one
//! JSON line per million frames and a summary; exits 1 on the first frame
//! where the kernel and the reference model disagree (reproducible from
//! the printed seed).

use std::time::Instant;

use clap::Parser;

#[derive(Parser)]
struct Args {
    /// Frames to run.
    #[arg(long, default_value_t = 1_000_000)]
    frames: usize,
    /// Seed of the frame generator (default: from the clock).
    #[arg(long)]
    seed: Option<u64>,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    eprintln!("fuzzing {} frames, seed {seed}", args.frames);
    let started = Instant::now();
    let mut done = 0;
    while done < args.frames {
        // A million frames per step, each step from its own derived seed.
        let step = 1_000_000.min(args.frames - done);
        let step_seed = seed.wrapping_add(done as u64);
        match limiter_tests::fuzz::run(step, step_seed) {
            Ok(summary) => {
                done += step;
                println!(
                    "{{\"frames\":{done},\"seed\":{step_seed},\"seconds\":{:.1},\"sources\":{},\"outcomes\":{}}}",
                    started.elapsed().as_secs_f64(),
                    summary.sources,
                    serde_json::to_string(&summary.outcomes).expect("JSON")
                );
            }
            Err(e) => {
                eprintln!(
                    "seed {step_seed} (run again with --seed {step_seed} --frames {step}):\n{e}"
                );
                return std::process::ExitCode::FAILURE;
            }
        }
    }
    eprintln!(
        "{done} frames: the kernel agreed with the model on every one ({:.0} s)",
        started.elapsed().as_secs_f64()
    );
    std::process::ExitCode::SUCCESS
}
