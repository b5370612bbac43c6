import { useEffect, useRef, useState } from "react";
import { Alert, Button, Card, Col, Input, InputNumber, Row, Select, Space, Statistic, Typography } from "antd";
import { api, asError, headers, type List } from "../lib/api";
import { millis } from "../lib/format";
import { readEvents } from "../lib/sse";
import { useSession } from "../session";

interface Model {
  id: string;
  ready?: boolean;
}
interface Counts {
  promptTokens: number;
  completionTokens: number;
}
interface RecordRow {
  requestId: string;
  engine: Counts | null;
  gateway: Counts & { method: string };
}
interface Turn {
  role: "user" | "assistant";
  content: string;
}
interface Run {
  status: "streaming" | "done" | "stopped" | "failed";
  ttftMs: number | null;
  totalMs: number | null;
  usage: Counts | null;
  gateway: (Counts & { method: string }) | null;
  requestId: string | null;
  error?: string;
}

export default function Playground() {
  const { token, who } = useSession();
  const [key, setKey] = useState(who.role === "tenant" || who.role === null ? (token ?? "") : "");
  const [models, setModels] = useState<Model[]>([]);
  const [model, setModel] = useState<string>();
  const [maxTokens, setMaxTokens] = useState(256);
  const [prompt, setPrompt] = useState("Tell me about the fleet.");
  const [turns, setTurns] = useState<Turn[]>([]);
  const [run, setRun] = useState<Run>();
  const [modelsError, setModelsError] = useState<string>();
  const abort = useRef<AbortController | null>(null);

  useEffect(() => {
    if (!key && who.role !== null) {
      setModels([]);
      setModelsError("Paste a tenant's API key to chat: the gateway serves tenants' keys, and a control-plane credential is not one.");
      return;
    }
    api<List<Model>>("/v1/models", { token: key || null })
      .then((list) => {
        setModels(list.data);
        setModel((m) => m ?? list.data[0]?.id);
        setModelsError(undefined);
      })
      .catch((e: Error) => setModelsError(e.message));
  }, [key, who.role]);

  async function send() {
    if (!model || !prompt.trim()) return;
    const history: Turn[] = [...turns, { role: "user", content: prompt }];
    setTurns([...history, { role: "assistant", content: "" }]);
    setPrompt("");
    const controller = new AbortController();
    abort.current = controller;
    const started = performance.now();
    let ttft: number | null = null;
    let usage: Counts | null = null;
    let requestId: string | null = null;
    setRun({ status: "streaming", ttftMs: null, totalMs: null, usage: null, gateway: null, requestId });
    try {
      const response = await fetch("/v1/chat/completions", {
        method: "POST",
        headers: headers(key || null, { "Content-Type": "application/json" }),
        body: JSON.stringify({
          model,
          messages: history,
          stream: true,
          stream_options: { include_usage: true },
          max_tokens: maxTokens,
        }),
        signal: controller.signal,
      });
      if (!response.ok || !response.body) throw await asError(response);
      requestId = response.headers.get("x-fleet-request-id") ?? response.headers.get("x-request-id");
      for await (const event of readEvents(response.body)) {
        if (event.data === "[DONE]") break;
        const chunk = JSON.parse(event.data);
        if (chunk.error) throw new Error(chunk.error.message ?? "the stream failed");
        if (chunk.usage) usage = { promptTokens: chunk.usage.prompt_tokens, completionTokens: chunk.usage.completion_tokens };
        const delta: string = chunk.choices?.[0]?.delta?.content ?? "";
        if (delta) {
          if (ttft === null) {
            ttft = performance.now() - started;
            setRun((r) => r && { ...r, ttftMs: ttft });
          }
          setTurns((all) => {
            const last = all[all.length - 1];
            return [...all.slice(0, -1), { ...last, content: last.content + delta }];
          });
        }
      }
      finish("done");
    } catch (e) {
      if (controller.signal.aborted) finish("stopped");
      else finish("failed", e instanceof Error ? e.message : String(e));
    }

    function finish(status: Run["status"], error?: string) {
      const total = performance.now() - started;
      setRun({ status, ttftMs: ttft, totalMs: total, usage, gateway: null, requestId, error });
      abort.current = null;
      if (requestId) void gatewayCount(requestId);
    }
  }

  /** The gateway's own count of the request, from its recent-requests log. */
  async function gatewayCount(requestId: string) {
    for (let attempt = 0; attempt < 10; attempt++) {
      try {
        const list = await api<List<RecordRow>>("/api/v1/requests?limit=200", { token: key || token });
        const found = list.data.find((r) => r.requestId === requestId);
        if (found) {
          setRun((r) => r && { ...r, gateway: found.gateway, usage: r.usage ?? found.engine });
          return;
        }
      } catch {
        return; // this credential may not read the log
      }
      await new Promise((resolve) => setTimeout(resolve, 300));
    }
  }

  const streaming = run?.status === "streaming";
  return (
    <Space direction="vertical" size="large" style={{ width: "100%" }}>
      <Typography.Title level={3}>Playground</Typography.Title>
      <Card>
        <Space wrap>
          <span>Model</span>
          <Select
            style={{ width: 280 }}
            value={model}
            onChange={setModel}
            options={models.map((m) => ({ value: m.id, label: m.ready === false ? `${m.id} (not ready)` : m.id }))}
            data-testid="model"
          />
          <span>Max tokens</span>
          <InputNumber min={1} max={32768} value={maxTokens} onChange={(v) => setMaxTokens(v ?? 256)} data-testid="max-tokens" />
          <span>API key</span>
          <Input.Password
            style={{ width: 260 }}
            value={key}
            placeholder={who.role === null ? "none needed" : "a tenant's API key"}
            onChange={(e) => setKey(e.target.value)}
          />
          <Button onClick={() => (setTurns([]), setRun(undefined))}>Clear</Button>
        </Space>
        {modelsError && <Alert style={{ marginTop: 12 }} type="warning" showIcon message={modelsError} />}
      </Card>
      <Card data-testid="transcript" style={{ minHeight: 200 }}>
        {turns.length === 0 && <Typography.Text type="secondary">No messages yet.</Typography.Text>}
        {turns.map((turn, i) => (
          <div key={i} style={{ marginBottom: 12 }}>
            <Typography.Text strong>{turn.role === "user" ? "You" : model}</Typography.Text>
            <div data-testid={turn.role === "assistant" ? "reply" : "asked"} style={{ whiteSpace: "pre-wrap" }}>
              {turn.content}
            </div>
          </div>
        ))}
      </Card>
      <Space.Compact style={{ width: "100%" }}>
        <Input.TextArea
          autoSize={{ minRows: 2, maxRows: 6 }}
          value={prompt}
          onChange={(e) => setPrompt(e.target.value)}
          onPressEnter={(e) => {
            if (!e.shiftKey) {
              e.preventDefault();
              void send();
            }
          }}
          data-testid="prompt"
        />
        {streaming ? (
          <Button danger onClick={() => abort.current?.abort()} data-testid="stop" style={{ height: "auto" }}>
            Stop
          </Button>
        ) : (
          <Button type="primary" onClick={() => void send()} data-testid="send" style={{ height: "auto" }}>
            Send
          </Button>
        )}
      </Space.Compact>
      {run && (
        <Card data-testid="run">
          <Row gutter={16}>
            <Col span={4}>
              <Statistic title="Status" value={run.status} valueStyle={{ fontSize: 18 }} />
            </Col>
            <Col span={4}>
              <Statistic title="Time to first token" value={millis(run.ttftMs)} valueStyle={{ fontSize: 18 }} />
            </Col>
            <Col span={4}>
              <Statistic title="Total time" value={millis(run.totalMs)} valueStyle={{ fontSize: 18 }} />
            </Col>
            <Col span={6}>
              <Statistic
                title="Engine usage (prompt / completion)"
                value={run.usage ? `${run.usage.promptTokens} / ${run.usage.completionTokens}` : "–"}
                valueStyle={{ fontSize: 18 }}
              />
            </Col>
            <Col span={6}>
              <Statistic
                title={`Gateway count${run.gateway ? ` (${run.gateway.method})` : ""}`}
                value={run.gateway ? `${run.gateway.promptTokens} / ${run.gateway.completionTokens}` : "–"}
                valueStyle={{ fontSize: 18 }}
              />
            </Col>
          </Row>
          {run.requestId && <Typography.Text type="secondary">request {run.requestId}</Typography.Text>}
          {run.error && <Alert type="error" showIcon message={run.error} style={{ marginTop: 12 }} />}
        </Card>
      )}
    </Space>
  );
}
