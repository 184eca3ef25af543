//! The image options of commands that decode instruction flow (`hwtrace
//! flow`): where the traced code's bytes come from.
//!
//! ```text
//! --image FILE[:OFF[-SIZE]]@ADDR   raw bytes (all numbers hex, 0x optional)
//! --elf FILE[@BIAS]                an ELF's executable segments at p_vaddr + BIAS
//! --pe FILE[@BASE]                 a PE's code sections at BASE (default ImageBase)
//! --pages DIR|PREFIX               a page cache (DIR/pages.*, a kAFL DIR/page_cache.*, or PREFIX.addr + PREFIX.dump)
//! --cr3 CR3|default                the address space of the images that follow
//! ```
//!
//! Options apply in command-line order: `--cr3` sets the address space for
//! every image after it, and a later image overrides an earlier one where
//! they overlap. That order is why [`ImageArgs`] implements clap's traits
//! by hand: derived structs lose the order between different options.

use anyhow::{Context, Result, bail};
use clap::{Arg, ArgAction, ArgMatches, Command};
use hwtrace_mem::image::{
    Image, ImageSpec, parse_elf_arg, parse_hex, parse_image_arg, parse_pe_arg,
};
use hwtrace_types::Cr3;
use std::path::PathBuf;

/// One image option, in command-line order.
#[derive(Clone, Debug, PartialEq, Eq)]
enum ImageItem {
    /// `--cr3`: the space of the images that follow (`None`: default space).
    Cr3(Option<Cr3>),
    /// `--image`, `--elf`, `--pe` or `--pages`, with the option's name.
    Load(&'static str, ImageSpec),
}

/// The image options of a command, in the order given. Use with
/// `#[command(flatten)]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageArgs {
    items: Vec<ImageItem>,
}

const LOADS: [&str; 4] = ["image", "elf", "pe", "pages"];

impl ImageArgs {
    /// Whether no image option was given.
    pub fn is_empty(&self) -> bool {
        !self
            .items
            .iter()
            .any(|item| matches!(item, ImageItem::Load(..)))
    }

    /// The images named, each with the CR3 it is for, in order.
    #[cfg(test)]
    pub fn specs(&self) -> impl Iterator<Item = (Option<Cr3>, &ImageSpec)> + '_ {
        let mut cr3 = None;
        self.items.iter().filter_map(move |item| match item {
            ImageItem::Cr3(c) => {
                cr3 = *c;
                None
            }
            ImageItem::Load(_, spec) => Some((cr3, spec)),
        })
    }

    /// Loads every image, in order. Fails naming the option, the file and
    /// the problem; an ELF or PE file without code is an error too.
    pub fn load(&self) -> Result<Image> {
        let mut image = Image::new();
        let mut cr3 = None;
        let mut pending_cr3 = None;
        for item in &self.items {
            match item {
                ImageItem::Cr3(c) => {
                    cr3 = *c;
                    pending_cr3 = Some(*c);
                }
                ImageItem::Load(option, spec) => {
                    pending_cr3 = None;
                    let added = image
                        .add(cr3, spec)
                        .with_context(|| format!("--{option}"))?;
                    if added == 0 {
                        bail!(
                            "--{option}: {}: no code to load (no executable segment or section)",
                            spec_path(spec).display()
                        );
                    }
                }
            }
        }
        if let Some(cr3) = pending_cr3 {
            let cr3 = cr3.map_or_else(|| "default".to_owned(), |c| c.to_string());
            bail!("--cr3 {cr3} is followed by no image (it applies to the images after it)");
        }
        Ok(image)
    }
}

fn spec_path(spec: &ImageSpec) -> &PathBuf {
    match spec {
        ImageSpec::Raw(raw) => &raw.path,
        ImageSpec::Elf(elf) => &elf.path,
        ImageSpec::Pe(pe) => &pe.path,
        ImageSpec::Pages(dir) => dir,
    }
}

fn parse_raw(s: &str) -> Result<ImageSpec, String> {
    parse_image_arg(s)
        .map(ImageSpec::Raw)
        .map_err(|e| e.to_string())
}

fn parse_elf(s: &str) -> Result<ImageSpec, String> {
    parse_elf_arg(s)
        .map(ImageSpec::Elf)
        .map_err(|e| e.to_string())
}

fn parse_pe(s: &str) -> Result<ImageSpec, String> {
    parse_pe_arg(s)
        .map(ImageSpec::Pe)
        .map_err(|e| e.to_string())
}

fn parse_pages(s: &str) -> Result<ImageSpec, String> {
    if s.is_empty() {
        return Err("missing folder or prefix".to_owned());
    }
    Ok(ImageSpec::Pages(PathBuf::from(s)))
}

/// `--cr3` values: hex, or `default` for the space of every CR3.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Cr3Choice(Option<Cr3>);

fn parse_cr3(s: &str) -> Result<Cr3Choice, String> {
    if s == "default" {
        return Ok(Cr3Choice(None));
    }
    parse_hex(s)
        .map(|v| Cr3Choice(Some(Cr3(v))))
        .ok_or_else(|| format!("{s:?} is not a hex CR3 (or `default`)"))
}

impl clap::Args for ImageArgs {
    fn augment_args(cmd: Command) -> Command {
        let load = |id: &'static str, value_name: &'static str, help: &'static str| {
            Arg::new(id)
                .long(id)
                .value_name(value_name)
                .action(ArgAction::Append)
                .help(help)
        };
        cmd.arg(
            load(
                "image",
                "FILE[:OFF[-SIZE]]@ADDR",
                "Raw code: SIZE bytes of FILE from OFF (default: all) at ADDR; numbers hex",
            )
            .value_parser(parse_raw),
        )
        .arg(
            load(
                "elf",
                "FILE[@BIAS]",
                "An ELF executable or shared object: executable PT_LOAD segments at p_vaddr + BIAS (hex)",
            )
            .value_parser(parse_elf),
        )
        .arg(
            load(
                "pe",
                "FILE[@BASE]",
                "A PE image: code sections at BASE (hex; default: its ImageBase)",
            )
            .value_parser(parse_pe),
        )
        .arg(
            load(
                "pages",
                "DIR|PREFIX",
                "A page cache: a folder holding pages.addr and pages.dump (or a kAFL/Nyx work folder's page_cache.addr and page_cache.dump), or PREFIX.addr and PREFIX.dump",
            )
            .value_parser(parse_pages),
        )
        .arg(
            Arg::new("cr3")
                .long("cr3")
                .value_name("CR3|default")
                .action(ArgAction::Append)
                .value_parser(parse_cr3)
                .help("The address space (hex CR3, as PIP reports it) of the images after it; `default`: every CR3"),
        )
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

impl clap::FromArgMatches for ImageArgs {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let mut args = Self::default();
        args.update_from_arg_matches(matches)?;
        Ok(args)
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        let mut items: Vec<(usize, ImageItem)> = Vec::new();
        for id in LOADS {
            let values = matches.try_get_many::<ImageSpec>(id).map_err(into_clap)?;
            if let (Some(values), Some(indices)) = (values, matches.indices_of(id)) {
                items.extend(indices.zip(values.map(|spec| ImageItem::Load(id, spec.clone()))));
            }
        }
        let values = matches
            .try_get_many::<Cr3Choice>("cr3")
            .map_err(into_clap)?;
        if let (Some(values), Some(indices)) = (values, matches.indices_of("cr3")) {
            items.extend(indices.zip(values.map(|c| ImageItem::Cr3(c.0))));
        }
        items.sort_by_key(|&(index, _)| index);
        self.items = items.into_iter().map(|(_, item)| item).collect();
        Ok(())
    }
}

fn into_clap(err: clap::parser::MatchesError) -> clap::Error {
    clap::Error::raw(clap::error::ErrorKind::ValueValidation, err.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use hwtrace_mem::image::{ElfPlacement, RawSpec};
    use hwtrace_types::{AddressSpace, Ip, ReadMemory};
    use std::path::Path;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        images: ImageArgs,
        /// Stands for the trace argument of the real command.
        trace: Option<String>,
    }

    fn parse(args: &[&str]) -> Result<ImageArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("hwtrace").chain(args.iter().copied()))
            .map(|cli| cli.images)
    }

    fn tmp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("hwtrace-image-args-{}-{name}", std::process::id()))
    }

    #[test]
    fn clap_accepts_the_definitions() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn options_keep_their_order_and_cr3_applies_to_what_follows() {
        let args = parse(&[
            "--elf",
            "/bin/true@1000",
            "trace.pt",
            "--cr3",
            "0x5000",
            "--image",
            "a.bin:10@2000",
            "--pages",
            "dir",
            "--cr3",
            "default",
            "--pe",
            "b.exe",
        ])
        .unwrap();
        let specs: Vec<(Option<Cr3>, &str)> = args
            .specs()
            .map(|(cr3, spec)| (cr3, spec_path(spec).to_str().unwrap()))
            .collect();
        assert_eq!(
            specs,
            [
                (None, "/bin/true"),
                (Some(Cr3(0x5000)), "a.bin"),
                (Some(Cr3(0x5000)), "dir"),
                (None, "b.exe"),
            ]
        );
        let (_, first) = args.specs().next().unwrap();
        assert!(matches!(first, ImageSpec::Elf(e) if e.placement == ElfPlacement::Bias(0x1000)));
        let (_, second) = args.specs().nth(1).unwrap();
        assert!(matches!(
            second,
            ImageSpec::Raw(RawSpec {
                offset: 0x10,
                addr: Ip(0x2000),
                ..
            })
        ));
        assert!(!args.is_empty());
        assert!(parse(&[]).unwrap().is_empty());
    }

    #[test]
    fn bad_values_are_refused_by_clap_naming_the_value() {
        for (args, needle) in [
            (&["--image", "a.bin"][..], "missing load address"),
            (&["--image", "a.bin@xyz"][..], "\"xyz\" is not a hex number"),
            (&["--cr3", "cafe_babe_zz"][..], "not a hex CR3"),
            (&["--elf", "@1000"][..], "missing file name"),
        ] {
            let err = parse(args).unwrap_err().to_string();
            assert!(err.contains(needle), "{args:?}: {err}");
        }
    }

    #[test]
    fn load_reads_the_images_in_their_spaces() {
        let path = tmp("code");
        std::fs::write(&path, [0x90u8, 0x90, 0xc3]).unwrap();
        let p = path.to_str().unwrap();
        let args = parse(&[
            "--image",
            &format!("{p}@1000"),
            "--cr3",
            "0x7000",
            "--image",
            &format!("{p}:2@1000"),
        ])
        .unwrap();
        let image = args.load().unwrap();
        let mut b = [0u8; 3];
        assert_eq!(
            image.read_memory(AddressSpace::UNKNOWN, Ip(0x1000), &mut b),
            Ok(3)
        );
        assert_eq!(b, [0x90, 0x90, 0xc3]);
        assert_eq!(
            image.read_memory(AddressSpace::with_cr3(Cr3(0x7000)), Ip(0x1000), &mut b),
            Ok(3)
        );
        assert_eq!(b, [0xc3, 0x90, 0xc3]);
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn load_errors_name_the_option_the_file_and_the_problem() {
        let text = tmp("not-elf");
        std::fs::write(&text, b"plain text, not an executable").unwrap();
        let t = text.to_str().unwrap();
        let err = parse(&["--elf", t]).unwrap().load().unwrap_err();
        let msg = format!("{err:#}");
        assert!(
            msg.starts_with(&format!("--elf: {t}: not an ELF file")),
            "{msg}"
        );

        let missing = tmp("missing");
        let m = missing.to_str().unwrap();
        let msg = format!("{:#}", parse(&["--pe", m]).unwrap().load().unwrap_err());
        assert!(msg.starts_with(&format!("--pe: {m}: ")), "{msg}");

        let msg = format!("{:#}", parse(&["--pages", m]).unwrap().load().unwrap_err());
        assert!(msg.starts_with(&format!("--pages: {m}: ")), "{msg}");

        let msg = format!(
            "{:#}",
            parse(&["--image", &format!("{t}:1000@0")])
                .unwrap()
                .load()
                .unwrap_err()
        );
        assert!(msg.contains("beyond the end of the file"), "{msg}");

        let msg = format!(
            "{:#}",
            parse(&["--image", &format!("{t}@0"), "--cr3", "1000"])
                .unwrap()
                .load()
                .unwrap_err()
        );
        assert!(
            msg.contains("--cr3 0x1000 is followed by no image"),
            "{msg}"
        );
        let _ = std::fs::remove_file(text);
    }

    #[test]
    fn load_of_a_real_executable() {
        if !Path::new("/bin/true").exists() {
            return;
        }
        let image = parse(&["--elf", "/bin/true@555555554000"])
            .unwrap()
            .load()
            .unwrap();
        assert!(!image.is_empty());
        assert!(
            image
                .sections()
                .iter()
                .all(|s| s.addr.0 >= 0x5555_5555_4000)
        );
    }
}
