// What `npm publish` would upload, checked without publishing (CI): `npm pack --dry-run --json` (which
// builds first, through `prepack`) must hold the LICENSE, the README and, for every entry point that
// package.json declares (`main`, `types`, each `exports` condition), the file it names; and nothing of
// the tests, the sources' generator config or local leftovers. The version is the release's, the one
// pyproject.toml sets (docs/releasing.md), in package.json and its lock. Exits 1 with one line per problem.
import { execFileSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const pkg = JSON.parse(readFileSync(join(root, "package.json"), "utf8"));
const out = execFileSync("npm", ["pack", "--dry-run", "--json", "--ignore-scripts=false"], {
  cwd: root,
  encoding: "utf8",
  stdio: ["ignore", "pipe", "inherit"],
});
// npm prints the build's own output before the JSON when prepack runs: the JSON is the last array.
const [report] = JSON.parse(out.slice(out.lastIndexOf("\n[") + 1));
const files = new Set(report.files.map((f) => f.path));
const problems = [];

const pyproject = readFileSync(join(root, "..", "..", "pyproject.toml"), "utf8");
const release = pyproject.match(/^\[project\][^[]*?^version = "([^"]+)"/ms)?.[1];
const lock = JSON.parse(readFileSync(join(root, "package-lock.json"), "utf8"));
for (const [where, version] of [
  ["package.json", pkg.version],
  ["package-lock.json", lock.version],
  ['package-lock.json packages[""]', lock.packages?.[""]?.version],
]) {
  if (version !== release) problems.push(`${where} has version ${version}, pyproject.toml ${release}`);
}

for (const required of ["package.json", "README.md", "LICENSE"]) {
  if (!files.has(required)) problems.push(`missing ${required}`);
}
const license = join(root, "LICENSE");
if (existsSync(license) && !readFileSync(license, "utf8").includes("Apache License")) {
  problems.push(`LICENSE is not the Apache License the package declares (${pkg.license})`);
}

/** Every file an entry point names, with where it is declared. */
function* entryPoints() {
  if (pkg.main) yield ["main", pkg.main];
  if (pkg.types) yield ["types", pkg.types];
  for (const [subpath, conditions] of Object.entries(pkg.exports ?? {})) {
    for (const [condition, file] of Object.entries(conditions)) yield [`exports["${subpath}"].${condition}`, file];
  }
}
for (const [where, file] of entryPoints()) {
  const path = file.replace(/^\.\//, "");
  if (!files.has(path)) problems.push(`${where} names ${file}, which is not in the tarball`);
  // A module format the file cannot be loaded as: "type": "module" makes every .js ESM, so a `require`
  // condition would need a .cjs file, and `import` must not name one.
  if (where.endsWith(".require") && pkg.type === "module" && !path.endsWith(".cjs")) {
    problems.push(`${where} names ${file}, an ES module ("type": "module") that require() cannot load`);
  }
  if (where.endsWith(".import") && path.endsWith(".cjs")) problems.push(`${where} names a CommonJS file`);
  if ((where === "types" || where.endsWith(".types")) && !path.endsWith(".d.ts")) {
    problems.push(`${where} names ${file}, not a type declaration`);
  }
}
for (const sub of Object.keys(pkg.exports ?? {})) {
  if (!pkg.exports[sub].types) problems.push(`exports["${sub}"] has no types`);
}

const unwanted = [
  [/(^|\/)test\//, "a test directory"],
  [/\.test\.[cm]?[jt]s$/, "a test file"],
  [/(^|\/)\.readme-/, "a README test leftover"],
  [/^src\//, "TypeScript sources (dist is the package)"],
  [/^(scripts|proto)\//, "build tooling"],
  [/(^|\/)(tsconfig[^/]*|vitest\.config\.[jt]s|buf\.gen\.yaml)$/, "build configuration"],
  [/(^|\/)node_modules\//, "node_modules"],
];
for (const path of files) {
  for (const [pattern, what] of unwanted) if (pattern.test(path)) problems.push(`${path}: ${what} in the tarball`);
}

if (problems.length) {
  console.error(`npm pack content of ${pkg.name}@${pkg.version} is not publishable:`);
  for (const p of problems) console.error(`  ${p}`);
  process.exit(1);
}
console.log(
  `npm pack content of ${report.id}: ${files.size} files, ${report.size} bytes packed` +
    ` (LICENSE, README, ${[...entryPoints()].length} entry points present; no tests)`,
);
