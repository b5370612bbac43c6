import { useEffect, useRef, useState } from "react";
import { Alert, App, Button, Card, Form, Input, Popconfirm, Progress, Space, Table, Tag, Typography } from "antd";
import { api, raw } from "../lib/api";
import { bytes } from "../lib/format";
import { readEvents } from "../lib/sse";
import { Pager, usePaged } from "../lib/usePaged";
import { useSession } from "../session";

interface WeightFile {
  path: string;
  size: number;
  sha256: string;
}
interface Model {
  id: string;
  source: { uri?: string; huggingface?: { repo: string; revision: string }; local?: { origin: string } };
  format: string | null;
  status: string;
  reason: string;
  revision: string | null;
  facts: { format: string; sizeBytes: number; parameters: number; architecture: string | null; quantization?: string | null; files: WeightFile[] } | null;
  updatedAt: string;
}
interface PullProgress {
  model: string;
  status: string;
  reason: string;
  filesDone: number;
  filesTotal: number;
  bytesDone: number;
  bytesTotal: number;
  bytesPerSecond: number;
  etaSeconds: number | null;
}

const STATUS_COLOR: Record<string, string> = { Ready: "green", Pulling: "blue", Failed: "red", Registered: "default" };

function source(m: Model): string {
  if (m.source.uri) return m.source.uri;
  if (m.source.huggingface) return `hf://${m.source.huggingface.repo}@${m.source.huggingface.revision}`;
  return m.source.local ? `local: ${m.source.local.origin}` : "–";
}

/** Live progress of one model's pull: the control plane's SSE stream, read with the token. */
function usePull(id: string, active: boolean, onEnd: () => void): PullProgress | undefined {
  const { token } = useSession();
  const [progress, setProgress] = useState<PullProgress>();
  const ended = useRef(onEnd);
  ended.current = onEnd;
  useEffect(() => {
    if (!active) return;
    const controller = new AbortController();
    (async () => {
      const response = await raw(`/api/v1/models/${encodeURIComponent(id)}/pull/events`, {
        token,
        signal: controller.signal,
        accept: "text/event-stream",
      });
      for await (const event of readEvents(response.body!)) {
        const snapshot = JSON.parse(event.data) as PullProgress;
        setProgress(snapshot);
        if (snapshot.status !== "Pulling") break;
      }
      ended.current();
    })().catch(() => !controller.signal.aborted && ended.current());
    return () => controller.abort();
  }, [id, active, token]);
  return progress;
}

function PullCell({ model, onChange }: { model: Model; onChange: () => void }) {
  const { token } = useSession();
  const { message } = App.useApp();
  const pulling = model.status === "Pulling";
  const progress = usePull(model.id, pulling, onChange);
  const path = `/api/v1/models/${encodeURIComponent(model.id)}/pull`;
  if (pulling) {
    const percent = progress && progress.bytesTotal ? Math.floor((100 * progress.bytesDone) / progress.bytesTotal) : 0;
    return (
      <Space direction="vertical" style={{ width: 260 }}>
        <Progress percent={percent} size="small" data-testid={`progress-${model.id}`} data-bytes={progress?.bytesDone ?? 0} />
        <Typography.Text type="secondary" style={{ fontSize: 12 }}>
          {progress ? `${bytes(progress.bytesDone)} of ${bytes(progress.bytesTotal)} · ${bytes(progress.bytesPerSecond)}/s` : "starting…"}
        </Typography.Text>
        <Popconfirm title="Cancel this pull?" onConfirm={() => api(path, { method: "DELETE", token }).then(onChange)}>
          <Button size="small" danger data-testid={`cancel-${model.id}`}>
            Cancel
          </Button>
        </Popconfirm>
      </Space>
    );
  }
  return (
    <Button
      size="small"
      data-testid={`pull-${model.id}`}
      onClick={() =>
        api(path, { method: "POST", token })
          .then(onChange)
          .catch((e: Error) => message.error(e.message))
      }
    >
      {model.status === "Ready" ? "Pull again" : "Pull"}
    </Button>
  );
}

export default function Models() {
  const { token } = useSession();
  const list = usePaged<Model>("/api/v1/models", token);
  const [form] = Form.useForm();
  const [error, setError] = useState<string>();

  async function register({ uri, id }: { uri: string; id?: string }) {
    try {
      await api("/api/v1/models", { method: "POST", token, body: { source: { uri: uri.trim() }, ...(id ? { id } : {}) } });
      form.resetFields();
      setError(undefined);
      list.reload();
    } catch (e) {
      setError(e instanceof Error ? e.message : String(e));
    }
  }

  return (
    <Space direction="vertical" size="large" style={{ width: "100%" }}>
      <Typography.Title level={3}>Models</Typography.Title>
      <Card title="Register a model">
        <Form form={form} layout="inline" onFinish={register}>
          <Form.Item name="uri" rules={[{ required: true, message: "hf://org/repo" }]}>
            <Input placeholder="hf://fleet/tiny-gguf" style={{ width: 320 }} data-testid="model-uri" />
          </Form.Item>
          <Form.Item name="id">
            <Input placeholder="id (optional)" style={{ width: 200 }} />
          </Form.Item>
          <Button type="primary" htmlType="submit" data-testid="register">
            Register
          </Button>
        </Form>
        {error && <Alert style={{ marginTop: 12 }} type="error" showIcon message={error} />}
      </Card>
      {list.error && <Alert type="error" showIcon message={list.error} />}
      <Table
        data-testid="models"
        rowKey="id"
        loading={list.loading && !list.data}
        dataSource={list.rows}
        pagination={false}
        expandable={{
          rowExpandable: (m) => Boolean(m.facts?.files.length),
          expandedRowRender: (m) => (
            <Table
              size="small"
              rowKey="path"
              pagination={false}
              dataSource={m.facts?.files ?? []}
              columns={[
                { title: "File", dataIndex: "path" },
                { title: "Size", dataIndex: "size", render: (n: number) => bytes(n) },
                { title: "sha256", dataIndex: "sha256", render: (s: string) => <Typography.Text code copyable>{s}</Typography.Text> },
              ]}
            />
          ),
        }}
        columns={[
          { title: "Model", dataIndex: "id" },
          { title: "Source", render: (_, m) => source(m) },
          { title: "Format", render: (_, m) => [m.facts?.format ?? m.format, m.facts?.quantization].filter(Boolean).join(" · ") || "–" },
          { title: "Revision", dataIndex: "revision", render: (r: string | null) => (r ? <Typography.Text code>{r.slice(0, 12)}</Typography.Text> : "–") },
          { title: "Size", render: (_, m) => (m.facts ? bytes(m.facts.sizeBytes) : "–") },
          {
            title: "Status",
            render: (_, m) => (
              <Space direction="vertical" size={0}>
                <Tag color={STATUS_COLOR[m.status] ?? "default"} data-testid={`status-${m.id}`}>{m.status}</Tag>
                {m.reason && <Typography.Text type="secondary" style={{ fontSize: 12 }}>{m.reason}</Typography.Text>}
              </Space>
            ),
          },
          { title: "Pull", render: (_, m) => <PullCell model={m} onChange={list.reload} /> },
        ]}
      />
      <Pager list={list} testId="models-pager" />
    </Space>
  );
}
