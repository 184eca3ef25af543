//! The code image the flow targets decode over ([`branchy_code`]).

use hwtrace_mem::image::Image;
use hwtrace_types::Ip;
use std::sync::OnceLock;

#[path = "branchy_code.rs"]
mod branchy_code;
use branchy_code::{BASES, CODE};

/// The image, built once.
pub fn image() -> &'static Image {
    static IMAGE: OnceLock<Image> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let mut image = Image::new();
        for base in BASES {
            image
                .add_bytes(None, Ip(base), CODE.to_vec(), "fuzz-code")
                .expect("fixed image loads");
        }
        image
    })
}
