//! The module graph of one crate, read from its source with `syn`: which
//! modules exist (from `mod` declarations, file or inline) and every
//! reference from one module to another, wherever the path is written.
//!
//! A `use` line is only one way in: a path written inline in a function body
//! (`crate::http::x()`), a path inside a macro's tokens (`format!`,
//! `sqlx::query!`, `tokio::select!`), and a path in an attribute's string
//! (`#[serde(default = "crate::config::duration")]`) all make the code
//! depend on the module they name, so all of them count. Code under
//! `#[cfg(test)]` is left out: tests may reach anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proc_macro2::{Spacing, TokenStream, TokenTree};
use syn::visit::{self, Visit};

/// A module's place in its crate: the names from the crate root down
/// (empty for the root itself).
pub type ModPath = Vec<String>;

/// One crate's modules and the references between them.
#[derive(Debug, Default)]
pub struct Crate {
    /// How the crate is named in messages (`server`, `client (bin)`).
    pub name: String,
    pub modules: BTreeMap<ModPath, Module>,
    pub references: Vec<Reference>,
}

#[derive(Debug, Default)]
pub struct Module {
    /// Where the module is written (shown in messages).
    pub file: String,
    pub children: BTreeSet<String>,
    /// Names a `use` brings in, each with the path it names as written,
    /// so that a later `name::item` resolves to where it points.
    imports: BTreeMap<String, Vec<String>>,
}

/// A path written in `from` that names something in module `to`.
#[derive(Clone, Debug)]
pub struct Reference {
    pub from: ModPath,
    pub to: ModPath,
    /// `file:line` of the path.
    pub at: String,
    /// The path as written.
    pub written: String,
}

/// A path before resolution: in which module, where, and its segments.
struct RawPath {
    module: ModPath,
    at: String,
    segments: Vec<String>,
    /// Written in a `use` line.
    in_use: bool,
}

/// Reads the crate whose root file is `root` (a `lib.rs` or `main.rs`),
/// following its `mod` declarations. `shown_from` is the directory that
/// file names in messages are relative to (the repository).
pub fn read_crate(name: &str, root: &Path, shown_from: &Path) -> Result<Crate, String> {
    let mut reader = Reader {
        shown_from: shown_from.to_path_buf(),
        modules: BTreeMap::new(),
        raw: Vec::new(),
        stack: Vec::new(),
        file: String::new(),
        dir: root.parent().map(Path::to_path_buf).unwrap_or_default(),
        error: None,
    };
    reader.read_file(Vec::new(), root)?;
    if let Some(error) = reader.error {
        return Err(error);
    }
    let mut krate = Crate {
        name: name.to_string(),
        modules: reader.modules,
        references: Vec::new(),
    };
    for raw in reader.raw {
        let Some(target) = krate.resolve(&raw.module, &raw.segments, raw.in_use, 0) else {
            continue;
        };
        let to = krate.longest_module(&target);
        krate.references.push(Reference {
            from: raw.module,
            to,
            at: raw.at,
            written: raw.segments.join("::"),
        });
    }
    Ok(krate)
}

impl Crate {
    /// The absolute path a path written in `module` names, or `None` when it
    /// names something outside the crate (another crate, `std`, a local).
    ///
    /// A name a `use` brought in is followed only inside other `use` lines:
    /// in code, the `use` itself is the reference (one per dependency, not
    /// one per call).
    fn resolve(
        &self,
        module: &ModPath,
        segments: &[String],
        in_use: bool,
        depth: usize,
    ) -> Option<Vec<String>> {
        let first = segments.first()?;
        let mut base = module.clone();
        let mut rest = segments;
        if first == "crate" || first == "$crate" {
            base.clear();
            rest = &segments[1..];
        } else if first == "self" || first == "super" {
            while let Some(segment) = rest.first() {
                match segment.as_str() {
                    "self" => {}
                    "super" => {
                        base.pop()?;
                    }
                    _ => break,
                }
                rest = &rest[1..];
            }
        } else {
            let here = self.modules.get(module)?;
            if here.children.contains(first) {
                // A child module named first: `child::item`.
            } else if let Some(imported) = here.imports.get(first).filter(|_| in_use) {
                // `use a::b; use b::c;`: the second names what the first does.
                if depth > 8 {
                    return None; // `use a as b; use b as a;`
                }
                let mut target = self.resolve(module, imported, true, depth + 1)?;
                target.extend(segments[1..].iter().cloned());
                return Some(target);
            } else {
                return None;
            }
        }
        base.extend(rest.iter().cloned());
        Some(base)
    }

    /// The longest prefix of `path` that is a module of this crate.
    fn longest_module(&self, path: &[String]) -> ModPath {
        (0..=path.len())
            .rev()
            .map(|n| path[..n].to_vec())
            .find(|prefix| self.modules.contains_key(prefix))
            .unwrap_or_default()
    }
}

struct Reader {
    shown_from: PathBuf,
    modules: BTreeMap<ModPath, Module>,
    raw: Vec<RawPath>,
    /// The module being read.
    stack: ModPath,
    /// The file being read, as shown in messages.
    file: String,
    /// Where the files of the current module's `mod x;` children live.
    dir: PathBuf,
    /// The first error met inside the visitor (which cannot return one).
    error: Option<String>,
}

impl Reader {
    fn read_file(&mut self, module: ModPath, path: &Path) -> Result<(), String> {
        let text = std::fs::read_to_string(path)
            .map_err(|error| format!("cannot read {}: {error}", path.display()))?;
        let parsed =
            syn::parse_file(&text).map_err(|error| format!("cannot parse {}: {error}", path.display()))?;
        let shown = path
            .strip_prefix(&self.shown_from)
            .unwrap_or(path)
            .display()
            .to_string();
        // A crate root and a `mod.rs` keep their children beside them;
        // `x.rs` keeps them in `x/`.
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        let parent = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let dir = if stem == "mod" || module.is_empty() {
            parent
        } else {
            parent.join(stem)
        };
        let saved = (
            std::mem::replace(&mut self.stack, module.clone()),
            std::mem::replace(&mut self.file, shown.clone()),
            std::mem::replace(&mut self.dir, dir),
        );
        self.modules.entry(module).or_default().file = shown;
        for attr in &parsed.attrs {
            self.visit_attribute(attr);
        }
        for item in &parsed.items {
            self.visit_item(item);
        }
        (self.stack, self.file, self.dir) = saved;
        Ok(())
    }

    fn line(&self, span: proc_macro2::Span) -> String {
        format!("{}:{}", self.file, span.start().line)
    }

    fn record(&mut self, segments: Vec<String>, span: proc_macro2::Span) {
        self.record_path(segments, span, false);
    }

    fn record_path(&mut self, segments: Vec<String>, span: proc_macro2::Span, in_use: bool) {
        if segments.is_empty() {
            return;
        }
        self.raw.push(RawPath {
            module: self.stack.clone(),
            at: self.line(span),
            segments,
            in_use,
        });
    }

    fn current(&mut self) -> &mut Module {
        self.modules.entry(self.stack.clone()).or_default()
    }

    /// Every `use` path, flattened: `use a::{b, c::{self, d as e}}` gives
    /// `a::b`, `a::c` and `a::c::d`, and binds `b`, `c` and `e`.
    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(path) => {
                prefix.push(path.ident.to_string());
                self.use_tree(prefix, &path.tree);
                prefix.pop();
            }
            syn::UseTree::Name(name) => {
                let full = full_use_path(prefix, &name.ident.to_string());
                if let Some(last) = full.last().cloned() {
                    self.current().imports.insert(last, full.clone());
                }
                self.record_path(full, name.ident.span(), true);
            }
            syn::UseTree::Rename(rename) => {
                let full = full_use_path(prefix, &rename.ident.to_string());
                let alias = rename.rename.to_string();
                if alias != "_" {
                    self.current().imports.insert(alias, full.clone());
                }
                self.record_path(full, rename.ident.span(), true);
            }
            syn::UseTree::Glob(glob) => {
                self.record_path(prefix.clone(), glob.star_token.span, true);
            }
            syn::UseTree::Group(group) => {
                for tree in &group.items {
                    self.use_tree(prefix, tree);
                }
            }
        }
    }

    /// Paths inside a macro's or an attribute's tokens: `crate`, `super`,
    /// `self` or a name followed by `::` and more names; and, in an
    /// attribute (`in_attribute`), strings that are paths. A macro's strings
    /// are text (`format!`, SQL), never paths.
    fn tokens(&mut self, tokens: TokenStream, in_attribute: bool) {
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < trees.len() {
            match &trees[i] {
                TokenTree::Group(group) => self.tokens(group.stream(), in_attribute),
                TokenTree::Ident(ident) if !follows_path_separator(&trees, i) => {
                    let mut segments = vec![ident.to_string()];
                    let mut j = i + 1;
                    while is_path_separator(&trees, j) {
                        match trees.get(j + 2) {
                            Some(TokenTree::Ident(next)) => segments.push(next.to_string()),
                            _ => break,
                        }
                        j += 3;
                    }
                    if segments.len() > 1 {
                        self.record(segments, ident.span());
                        i = j;
                        continue;
                    }
                }
                TokenTree::Literal(literal) if in_attribute => self.string_path(literal),
                _ => {}
            }
            i += 1;
        }
    }

    /// A string literal that is a path into the crate, as serde's
    /// `default = "crate::config::duration"` or `with = "super::x"`.
    fn string_path(&mut self, literal: &proc_macro2::Literal) {
        let tokens: TokenStream = TokenTree::Literal(literal.clone()).into();
        let Ok(string) = syn::parse2::<syn::LitStr>(tokens) else {
            return;
        };
        let value = string.value();
        if ["crate::", "super::", "self::"]
            .iter()
            .any(|prefix| value.starts_with(prefix))
        {
            let segments = value.split("::").map(|s| s.trim().to_string()).collect();
            self.record(segments, literal.span());
        }
    }

    fn enter_inline_module(&mut self, item: &syn::ItemMod, items: &[syn::Item]) {
        let name = item.ident.to_string();
        self.current().children.insert(name.clone());
        let mut module = self.stack.clone();
        module.push(name.clone());
        let file = self.file.clone();
        self.modules.entry(module.clone()).or_default().file = file;
        let saved_stack = std::mem::replace(&mut self.stack, module);
        let saved_dir = self.dir.clone();
        self.dir = self.dir.join(&name);
        for attr in &item.attrs {
            self.visit_attribute(attr);
        }
        for item in items {
            self.visit_item(item);
        }
        self.stack = saved_stack;
        self.dir = saved_dir;
    }

    fn enter_file_module(&mut self, item: &syn::ItemMod) {
        let name = item.ident.to_string();
        self.current().children.insert(name.clone());
        let flat = self.dir.join(format!("{name}.rs"));
        let nested = self.dir.join(&name).join("mod.rs");
        let path = if flat.exists() { flat } else { nested };
        let mut module = self.stack.clone();
        module.push(name);
        if let Err(error) = self.read_file(module, &path) {
            self.error.get_or_insert(error);
        }
    }
}

fn full_use_path(prefix: &[String], name: &str) -> Vec<String> {
    let mut full = prefix.to_vec();
    // `use a::b::{self}` names `a::b` itself.
    if name != "self" {
        full.push(name.to_string());
    }
    full
}

/// `::` at `trees[at]`: a joint `:` followed by a `:`.
fn is_path_separator(trees: &[TokenTree], at: usize) -> bool {
    matches!(
        (trees.get(at), trees.get(at + 1)),
        (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)))
            if a.as_char() == ':' && a.spacing() == Spacing::Joint && b.as_char() == ':'
    )
}

/// Whether the ident at `at` continues a path (`x::<T>::name`, `::std`):
/// only a path's first name can be resolved.
fn follows_path_separator(trees: &[TokenTree], at: usize) -> bool {
    at >= 2 && is_path_separator(trees, at - 2)
}

/// Code under `#[cfg(test)]` (or `cfg(all(test, ...))`) is test code.
pub fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        if !attr.path().is_ident("cfg") {
            return false;
        }
        let Ok(list) = attr.meta.require_list() else {
            return false;
        };
        let text = list.tokens.to_string().replace(' ', "");
        text == "test" || (text.starts_with("all(") && text[4..].split([',', ')']).any(|t| t == "test"))
    })
}

fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    use syn::Item;
    match item {
        Item::Const(i) => &i.attrs,
        Item::Enum(i) => &i.attrs,
        Item::ExternCrate(i) => &i.attrs,
        Item::Fn(i) => &i.attrs,
        Item::ForeignMod(i) => &i.attrs,
        Item::Impl(i) => &i.attrs,
        Item::Macro(i) => &i.attrs,
        Item::Mod(i) => &i.attrs,
        Item::Static(i) => &i.attrs,
        Item::Struct(i) => &i.attrs,
        Item::Trait(i) => &i.attrs,
        Item::TraitAlias(i) => &i.attrs,
        Item::Type(i) => &i.attrs,
        Item::Union(i) => &i.attrs,
        Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

impl<'ast> Visit<'ast> for Reader {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if is_test_only(item_attrs(item)) {
            return;
        }
        visit::visit_item(self, item);
    }

    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        match &item.content {
            Some((_, items)) => self.enter_inline_module(item, items),
            None => {
                for attr in &item.attrs {
                    self.visit_attribute(attr);
                }
                self.enter_file_module(item);
            }
        }
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        let attrs: &[syn::Attribute] = match item {
            syn::ImplItem::Const(i) => &i.attrs,
            syn::ImplItem::Fn(i) => &i.attrs,
            syn::ImplItem::Type(i) => &i.attrs,
            syn::ImplItem::Macro(i) => &i.attrs,
            _ => &[],
        };
        if !is_test_only(attrs) {
            visit::visit_impl_item(self, item);
        }
    }

    fn visit_trait_item(&mut self, item: &'ast syn::TraitItem) {
        let attrs: &[syn::Attribute] = match item {
            syn::TraitItem::Const(i) => &i.attrs,
            syn::TraitItem::Fn(i) => &i.attrs,
            syn::TraitItem::Type(i) => &i.attrs,
            syn::TraitItem::Macro(i) => &i.attrs,
            _ => &[],
        };
        if !is_test_only(attrs) {
            visit::visit_trait_item(self, item);
        }
    }

    fn visit_stmt(&mut self, stmt: &'ast syn::Stmt) {
        if let syn::Stmt::Local(local) = stmt
            && is_test_only(&local.attrs)
        {
            return;
        }
        visit::visit_stmt(self, stmt);
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        let mut prefix = Vec::new();
        if item.leading_colon.is_some() {
            // `use ::name`: always another crate.
            return;
        }
        self.use_tree(&mut prefix, &item.tree);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none()
            && let Some(first) = path.segments.first()
        {
            let segments = path.segments.iter().map(|s| s.ident.to_string()).collect();
            self.record(segments, first.ident.span());
        }
        visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.tokens(mac.tokens.clone(), false);
        visit::visit_macro(self, mac);
    }

    fn visit_attribute(&mut self, attr: &'ast syn::Attribute) {
        // Doc comments link to items for readers; they are not code.
        if attr.path().is_ident("doc") {
            return;
        }
        match &attr.meta {
            syn::Meta::Path(path) => self.visit_path(path),
            syn::Meta::List(list) => {
                self.visit_path(&list.path);
                self.tokens(list.tokens.clone(), true);
            }
            syn::Meta::NameValue(pair) => {
                if let syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(string),
                    ..
                }) = &pair.value
                {
                    self.string_path(&string.token());
                }
            }
        }
    }
}
