// Starts `rulec lsp` (LSP over stdio) for .rules files. The server does the work; this only launches it.
"use strict";
const vscode = require("vscode");
const { LanguageClient } = require("vscode-languageclient/node");

let client;

function activate(context) {
  const config = vscode.workspace.getConfiguration("rulec");
  const [command, ...args] = config.get("server.command", ["rulec", "lsp"]);
  const folder = vscode.workspace.workspaceFolders && vscode.workspace.workspaceFolders[0];
  const serverOptions = { command, args, options: folder ? { cwd: folder.uri.fsPath } : {} };
  const statsFile = config.get("statsFile", "");
  const clientOptions = {
    documentSelector: [{ scheme: "file", language: "rulec" }, { scheme: "untitled", language: "rulec" }],
    initializationOptions: statsFile ? { statsFile } : {},
  };
  client = new LanguageClient("rulec", "rulec language server", serverOptions, clientOptions);
  client.start();
  context.subscriptions.push({ dispose: () => client && client.stop() });
}

function deactivate() {
  return client ? client.stop() : undefined;
}

module.exports = { activate, deactivate };
