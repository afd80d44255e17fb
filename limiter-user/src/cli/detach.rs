//! `xdp-limiter detach`: stop protecting. A running daemon is asked to
//! detach (it detaches every interface and exits); without one, the pins
//! that `run --keep-attached` left are removed, which detaches the
//! program (and its component leaves libxdp's dispatcher).

use limiter_common::names;

use super::{
    args::DetachArgs,
    client::{self, ClientError},
};
use crate::{
    kernel::{dispatcher, pins},
    proto::{Reply, Request},
};

pub fn run(args: &DetachArgs) -> anyhow::Result<()> {
    // A running daemon owns the interfaces: ask it (it detaches them all).
    match client::request(&args.socket.path, Request::Detach) {
        Ok(Reply::Done { message }) => {
            println!("{message}");
            return Ok(());
        }
        Ok(_) => anyhow::bail!("the daemon answered `detach` with something unexpected"),
        Err(ClientError::NotRunning(_)) => {}
        Err(e) => return Err(e.into()),
    }
    let interfaces = if args.interfaces.is_empty() {
        pins::pinned_interfaces(&args.pin_dir)
    } else {
        args.interfaces.clone()
    };
    if interfaces.is_empty() {
        println!("nothing pinned under {}", args.pin_dir.display());
        return Ok(());
    }
    for iface in interfaces {
        let dir = pins::iface_dir(&args.pin_dir, &iface);
        if !pins::is_pinned(&dir) {
            anyhow::bail!("{iface}: nothing pinned under {}", dir.display());
        }
        // A component `--keep-attached` left in libxdp's dispatcher.
        if let Ok(ifindex) = nix::net::if_::if_nametoindex(iface.as_str()) {
            for id in dispatcher::components_named(ifindex, names::PROGRAM) {
                dispatcher::leave(&iface, ifindex, id)?;
            }
        }
        pins::remove_pins(&dir)?;
        println!("{iface}: detached");
    }
    Ok(())
}
