//! Function names, looked up once per distinct address and interned, so
//! that frames, stacks and profiles carry a small [`FuncId`] instead of a
//! string.

use hwtrace_types::hash::BuildIntHasher;
use hwtrace_types::{Cr3, Ip};
use std::collections::HashMap;

/// What a symboliser says about an address.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FunctionName {
    /// The function's name as every output shows it (a symbol, or
    /// `image+0xoff`, or the address).
    pub name: String,
    /// The image (file) the address is in, if known.
    pub image: Option<String>,
}

/// An address of code in its address space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct CodeAddr {
    /// The process, if known (perf.data threads).
    pub pid: Option<u32>,
    /// The CR3, if known (PT's PIP packets).
    pub cr3: Option<Cr3>,
    /// The address.
    pub ip: Ip,
}

/// Names the function an address belongs to. Called once per distinct
/// frame address: with the entry address of a called function, and with
/// the first address seen in a function the trace began inside (or
/// returned into), which may be mid-function.
pub trait Symbolize {
    /// The function containing (or starting at) `at`.
    fn function(&mut self, at: CodeAddr) -> FunctionName;
}

/// Names functions by address (`0x401000`), for traces without symbols.
#[derive(Clone, Copy, Debug, Default)]
pub struct HexNames;

impl Symbolize for HexNames {
    fn function(&mut self, at: CodeAddr) -> FunctionName {
        FunctionName {
            name: format!("{:#x}", at.ip),
            image: None,
        }
    }
}

impl<F: FnMut(CodeAddr) -> FunctionName> Symbolize for F {
    fn function(&mut self, at: CodeAddr) -> FunctionName {
        self(at)
    }
}

/// An interned function: an index into [`Functions`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FuncId(pub u32);

/// The functions seen so far, by address and by name.
pub struct Functions {
    symbolize: Box<dyn Symbolize>,
    by_ip: HashMap<CodeAddr, FuncId, BuildIntHasher>,
    by_name: HashMap<FunctionName, FuncId>,
    names: Vec<FunctionName>,
}

impl std::fmt::Debug for Functions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Functions")
            .field("addresses", &self.by_ip.len())
            .field("functions", &self.names.len())
            .finish()
    }
}

impl Functions {
    /// An empty table naming functions with `symbolize`.
    pub fn new(symbolize: Box<dyn Symbolize>) -> Self {
        Self {
            symbolize,
            by_ip: HashMap::default(),
            by_name: HashMap::new(),
            names: Vec::new(),
        }
    }

    /// The function at `at`. Two addresses the symboliser names alike (two
    /// places inside one function) are one function.
    pub fn at(&mut self, at: CodeAddr) -> FuncId {
        if let Some(&id) = self.by_ip.get(&at) {
            return id;
        }
        let name = self.symbolize.function(at);
        let id = match self.by_name.get(&name) {
            Some(&id) => id,
            None => {
                let id = FuncId(u32::try_from(self.names.len()).unwrap_or(u32::MAX));
                self.names.push(name.clone());
                self.by_name.insert(name, id);
                id
            }
        };
        self.by_ip.insert(at, id);
        id
    }

    /// The name of `id` (`?` for an id this table did not hand out).
    pub fn name(&self, id: FuncId) -> &str {
        self.names
            .get(id.0 as usize)
            .map_or("?", |n| n.name.as_str())
    }

    /// The image `id` is in, if known.
    pub fn image(&self, id: FuncId) -> Option<&str> {
        self.names.get(id.0 as usize)?.image.as_deref()
    }

    /// How many distinct functions were seen.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether no function was seen.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_named_alike_are_one_function() {
        let mut f = Functions::new(Box::new(|at: CodeAddr| FunctionName {
            name: if at.ip.0 < 0x2000 { "a" } else { "b" }.to_owned(),
            image: Some("img".to_owned()),
        }));
        let code = |ip| CodeAddr {
            pid: Some(1),
            cr3: None,
            ip: Ip(ip),
        };
        let a = f.at(code(0x1000));
        assert_eq!(f.at(code(0x1010)), a);
        let b = f.at(code(0x2000));
        assert_ne!(a, b);
        assert_eq!(f.name(a), "a");
        assert_eq!(f.name(b), "b");
        assert_eq!(f.image(b), Some("img"));
        assert_eq!(f.len(), 2);
        assert_eq!(f.name(FuncId(7)), "?");
    }
}
